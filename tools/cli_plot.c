/* Loss curves as a hand-written SVG: axes, ticks, labels, a legend and one polyline per
 * series (training loss, held-out loss). */
#include "tools/cli.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

static void put_escaped(FILE *f, const char *text) {
  for (const char *c = text; *c; c++) {
    if (*c == '<')
      fputs("&lt;", f);
    else if (*c == '>')
      fputs("&gt;", f);
    else if (*c == '&')
      fputs("&amp;", f);
    else
      fputc(*c, f);
  }
}

int cli_write_svg(const char *path, const cli_series *series, size_t num_series,
                  const char *title) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  const double W = 640, H = 400, L = 70, R = 20, T = 40, B = 50;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (size_t k = 0; k < num_series; k++)
    for (size_t i = 0; i < series[k].n; i++) {
      double x = (double)series[k].steps[i], y = series[k].values[i];
      if (x < x0) x0 = x;
      if (x > x1) x1 = x;
      if (!isfinite(y)) continue;
      if (y < y0) y0 = y;
      if (y > y1) y1 = y;
    }
  if (!(x0 <= x1)) x0 = 0, x1 = 1;
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
  put_escaped(f, title);
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
  for (size_t k = 0; k < num_series; k++) {
    const cli_series *c = &series[k];
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", c->color);
    bool first = true;
    for (size_t i = 0; i < c->n; i++) {
      if (!isfinite(c->values[i])) continue;
      double px = L + pw * ((double)c->steps[i] - x0) / (x1 - x0);
      double py = T + ph - ph * (c->values[i] - y0) / (y1 - y0);
      fprintf(f, "%s%.1f,%.1f", first ? "" : " ", px, py);
      first = false;
    }
    fputs("\"/>\n", f);
    /* legend, top right */
    double ly = T + 14 + 16 * (double)k;
    fprintf(f,
            "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" "
            "stroke-width=\"2\"/><text x=\"%.0f\" y=\"%.0f\">",
            L + pw - 150, ly - 4, L + pw - 130, ly - 4, c->color, L + pw - 124, ly);
    put_escaped(f, c->label);
    fputs("</text>\n", f);
  }
  fputs("</svg>\n", f);
  int bad = ferror(f);
  if (fclose(f) != 0 || bad) return -1;
  return 0;
}
