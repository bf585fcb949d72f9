/* The loss curve as a hand-written SVG: axes, ticks, labels and one polyline. */
#include "tools/cli.h"

#include <errno.h>
#include <math.h>
#include <string.h>

int cli_write_svg(const char *path, const long *steps, const float *loss, size_t n,
                  const char *title) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  const double W = 640, H = 400, L = 70, R = 20, T = 40, B = 50;
  double x0 = n ? (double)steps[0] : 0, x1 = n ? (double)steps[n - 1] : 1;
  double y0 = INFINITY, y1 = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(loss[i])) continue;
    if (loss[i] < y0) y0 = loss[i];
    if (loss[i] > y1) y1 = loss[i];
  }
  if (!(y0 <= y1)) y0 = 0, y1 = 1;
  if (x1 <= x0) x1 = x0 + 1;
  double pad = (y1 - y0) * 0.05 + 1e-6;
  y0 = y0 - pad < 0 && y0 >= 0 ? 0 : y0 - pad;
  y1 += pad;
  double pw = W - L - R, ph = H - T - B;
  fprintf(f,
          "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
          "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n"
          "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
          W, H, W, H);
  fprintf(f, "<text x=\"%.0f\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">", W / 2);
  for (const char *c = title; *c; c++) {
    if (*c == '<')
      fputs("&lt;", f);
    else if (*c == '>')
      fputs("&gt;", f);
    else if (*c == '&')
      fputs("&amp;", f);
    else
      fputc(*c, f);
  }
  fputs("</text>\n", f);
  /* axes */
  fprintf(f,
          "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n"
          "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n",
          L, T + ph, L + pw, T + ph, L, T, L, T + ph);
  for (int i = 0; i <= 5; i++) {
    double fx = L + pw * i / 5, fy = T + ph - ph * i / 5;
    double vx = x0 + (x1 - x0) * i / 5, vy = y0 + (y1 - y0) * i / 5;
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"black\"/>"
            "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.0f</text>\n",
            fx, T + ph, fx, T + ph + 5, fx, T + ph + 19, vx);
    fprintf(f,
            "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
            "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n",
            L, fy, L + pw, fy, L - 6, fy + 4, vy);
  }
  fprintf(f,
          "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">step</text>\n"
          "<text x=\"16\" y=\"%.0f\" text-anchor=\"middle\" "
          "transform=\"rotate(-90 16 %.0f)\">loss</text>\n",
          L + pw / 2, H - 10, T + ph / 2, T + ph / 2);
  fputs("<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"", f);
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(loss[i])) continue;
    double px = L + pw * ((double)steps[i] - x0) / (x1 - x0);
    double py = T + ph - ph * (loss[i] - y0) / (y1 - y0);
    fprintf(f, "%s%.1f,%.1f", i ? " " : "", px, py);
  }
  fputs("\"/>\n</svg>\n", f);
  int bad = ferror(f);
  if (fclose(f) != 0 || bad) return -1;
  return 0;
}
