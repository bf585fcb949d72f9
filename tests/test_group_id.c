/* Sharing a group id over TCP (mn_group_id_share_tcp), ranks as threads on 127.0.0.1: every
 * rank gets rank 0's bytes whichever starts first; a missing rank 0, a missing peer, a rank
 * that connects twice and a world size that differs are clear errors within the timeout; a
 * name that does not resolve, a port in use and bad arguments are refused. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/mn_test.h"

enum { MAX_RANKS = 4 };

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* A port nobody listens on: bound to port 0 by the kernel, then released. When listening is
 * true the socket stays open and listening (its fd in *fd) to hold the port. */
static int free_port(bool listening, int *fd) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  cr_assert(s >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(bind(s, (struct sockaddr *)&a, sizeof a), 0);
  socklen_t len = sizeof a;
  cr_assert_eq(getsockname(s, (struct sockaddr *)&a, &len), 0);
  if (listening) {
    cr_assert_eq(listen(s, 4), 0);
    *fd = s;
  } else {
    close(s);
  }
  return ntohs(a.sin_port);
}

typedef struct rank_call {
  pthread_t thread;
  int port, rank, world_size;
  double timeout_s, seconds;
  mn_group_id id;
  mn_status st;
  char error[512];
} rank_call;

static void *share(void *arg) {
  rank_call *c = arg;
  double t0 = now_s();
  c->st = mn_group_id_share_tcp("127.0.0.1", c->port, c->rank, c->world_size, c->timeout_s, &c->id);
  c->seconds = now_s() - t0;
  snprintf(c->error, sizeof c->error, "%s", mn_last_error());
  return NULL;
}

static void start(rank_call *c, int port, int rank, int world_size, double timeout_s) {
  *c = (rank_call){.port = port, .rank = rank, .world_size = world_size, .timeout_s = timeout_s};
  if (rank == 0)
    for (size_t i = 0; i < sizeof c->id.bytes; i++)
      c->id.bytes[i] = (unsigned char)(i * 13 + 5);
  cr_assert_eq(pthread_create(&c->thread, NULL, share, c), 0);
}

static void pause_ms(long ms) {
  struct timespec t = {ms / 1000, ms % 1000 * 1000000L};
  nanosleep(&t, NULL);
}

Test(group_id, every_rank_gets_rank_0s_bytes) {
  for (int n = 1; n <= MAX_RANKS; n++) {
    int port = free_port(false, NULL);
    rank_call c[MAX_RANKS];
    /* The peers start first, so that they retry until rank 0 listens. */
    for (int r = n - 1; r >= 0; r--) {
      start(&c[r], port, r, n, 10);
      if (r == 1) pause_ms(150);
    }
    for (int r = 0; r < n; r++)
      pthread_join(c[r].thread, NULL);
    for (int r = 0; r < n; r++) {
      cr_assert_eq(c[r].st, MN_OK, "%d ranks, rank %d: %s", n, r, c[r].error);
      cr_expect(memcmp(c[r].id.bytes, c[0].id.bytes, sizeof c[0].id.bytes) == 0,
                "%d ranks: rank %d got other bytes", n, r);
      cr_expect_lt(c[r].seconds, 5.0);
    }
  }
}

Test(group_id, a_missing_rank_0_times_out) {
  int port = free_port(false, NULL);
  rank_call c;
  start(&c, port, 1, 2, 0.5);
  pthread_join(c.thread, NULL);
  cr_expect_eq(c.st, MN_ERR_STATE);
  cr_expect_geq(c.seconds, 0.45);
  cr_expect_lt(c.seconds, 2.0);
  char want[64];
  snprintf(want, sizeof want, "for rank 0 at 127.0.0.1:%d", port);
  cr_expect(strstr(c.error, "rank 1 waited 0.5 s") && strstr(c.error, want), "%s", c.error);
}

Test(group_id, rank_0_names_the_missing_peer) {
  int port = free_port(false, NULL);
  rank_call c[3];
  start(&c[0], port, 0, 3, 0.5);
  start(&c[1], port, 1, 3, 5);
  pthread_join(c[0].thread, NULL);
  pthread_join(c[1].thread, NULL);
  cr_expect_eq(c[1].st, MN_OK, "%s", c[1].error);
  cr_expect_eq(c[0].st, MN_ERR_STATE);
  cr_expect_geq(c[0].seconds, 0.45);
  cr_expect_lt(c[0].seconds, 2.0);
  cr_expect(strstr(c[0].error, "for rank(s) 2 of 3") != NULL, "%s", c[0].error);
}

Test(group_id, a_rank_that_connects_twice_is_refused) {
  int port = free_port(false, NULL);
  rank_call c[3];
  start(&c[0], port, 0, 3, 5);
  start(&c[1], port, 1, 3, 5);
  pthread_join(c[1].thread, NULL);
  cr_assert_eq(c[1].st, MN_OK, "%s", c[1].error);
  start(&c[2], port, 1, 3, 5);
  pthread_join(c[2].thread, NULL);
  pthread_join(c[0].thread, NULL);
  cr_expect_eq(c[0].st, MN_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(c[0].error, "rank 1 connected twice") != NULL, "%s", c[0].error);
  cr_expect_eq(c[2].st, MN_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(c[2].error, "already gave the id to a rank 1") != NULL, "%s", c[2].error);
}

Test(group_id, a_different_world_size_is_refused_by_both) {
  int port = free_port(false, NULL);
  rank_call c[2];
  start(&c[0], port, 0, 2, 5);
  start(&c[1], port, 1, 3, 5);
  pthread_join(c[0].thread, NULL);
  pthread_join(c[1].thread, NULL);
  cr_expect_eq(c[0].st, MN_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(c[0].error, "rank 1 of 3 ranks connected to rank 0 of 2") != NULL, "%s",
            c[0].error);
  cr_expect_eq(c[1].st, MN_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(c[1].error, "has a world size of 2") != NULL, "%s", c[1].error);
}

Test(group_id, a_stranger_on_the_port_does_not_stop_rank_0) {
  int port = free_port(false, NULL);
  rank_call c[2];
  start(&c[0], port, 0, 2, 5);
  pause_ms(100);
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(connect(s, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(send(s, "GET / HTTP/1.0\r\n", 16, 0), 16);
  start(&c[1], port, 1, 2, 5);
  pthread_join(c[0].thread, NULL);
  pthread_join(c[1].thread, NULL);
  close(s);
  cr_expect_eq(c[0].st, MN_OK, "%s", c[0].error);
  cr_expect_eq(c[1].st, MN_OK, "%s", c[1].error);
  cr_expect(memcmp(c[0].id.bytes, c[1].id.bytes, sizeof c[0].id.bytes) == 0);
}

Test(group_id, a_port_in_use_and_a_bad_name_are_io_errors) {
  int held = -1, port = free_port(true, &held);
  mn_group_id id = {{0}};
  cr_expect_eq(mn_group_id_share_tcp(NULL, port, 0, 2, 1, &id), MN_ERR_IO);
  char want[64];
  snprintf(want, sizeof want, "cannot listen on port %d", port);
  cr_expect(strstr(mn_last_error(), want) != NULL, "%s", mn_last_error());
  close(held);
  double t0 = now_s();
  cr_expect_eq(mn_group_id_share_tcp("no-such-host.invalid", port, 1, 2, 30, &id), MN_ERR_IO);
  cr_expect_lt(now_s() - t0, 20.0);
  cr_expect(strstr(mn_last_error(), "cannot resolve rank 0's address \"no-such-host.invalid\"") !=
                NULL,
            "%s", mn_last_error());
}

Test(group_id, bad_arguments_are_refused) {
  mn_group_id id = {{0}};
  cr_expect_eq(mn_group_id_share_tcp("127.0.0.1", 29500, 0, 2, 1, NULL), MN_ERR_INVALID_ARGUMENT);
  cr_expect_eq(mn_group_id_share_tcp("127.0.0.1", 29500, 0, 0, 1, &id), MN_ERR_INVALID_ARGUMENT);
  cr_expect_eq(mn_group_id_share_tcp("127.0.0.1", 29500, 2, 2, 1, &id), MN_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(mn_last_error(), "rank = 2 outside [0, 2)") != NULL, "%s", mn_last_error());
  cr_expect_eq(mn_group_id_share_tcp("127.0.0.1", -1, 1, 2, 1, &id), MN_ERR_INVALID_ARGUMENT);
  cr_expect_eq(mn_group_id_share_tcp("127.0.0.1", 65536, 1, 2, 1, &id), MN_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(mn_last_error(), "master_port = 65536 is not a port") != NULL, "%s",
            mn_last_error());
  cr_expect_eq(mn_group_id_share_tcp(NULL, 29500, 1, 2, 1, &id), MN_ERR_INVALID_ARGUMENT);
  cr_expect_eq(mn_group_id_share_tcp("", 29500, 1, 2, 1, &id), MN_ERR_INVALID_ARGUMENT);
  /* One rank needs nobody: no port is opened. */
  cr_expect_eq(mn_group_id_share_tcp(NULL, 29500, 0, 1, 1, &id), MN_OK);
}
