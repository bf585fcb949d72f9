/* mn_group_id_share_tcp: rank 0 hands the group id to the other ranks over TCP, as torchrun's
 * store does at MASTER_ADDR:MASTER_PORT.
 *
 * A peer sends 12 bytes: "MNID", its rank and its world size (big-endian 32-bit). Rank 0
 * answers 136 bytes: a status, a value and the id (zeros unless the status is REPLY_OK).
 * Knowing each peer's rank lets rank 0 name the ranks missing at the deadline and refuse a
 * rank that connects twice; a connection that does not speak this (a port scanner, a stale
 * job) is dropped without stopping the others. Every wait is a poll() bounded by the time
 * left, so no rank blocks past timeout_s. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "host/collective.h"
#include "host/error.h"

#define HELLO_BYTES 12
#define REPLY_BYTES (8 + (int)sizeof(((mn_group_id *)0)->bytes))

enum { REPLY_OK = 0, REPLY_WORLD_SIZE = 1, REPLY_TWICE = 2 };

static const char *const FN = "mn_group_id_share_tcp";

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Milliseconds to the deadline for poll(), at least 0 and rounded up, so that a poll that
 * returns on its timeout leaves the deadline passed. */
static int ms_left(double deadline) {
  double left = deadline - now_s();
  if (left <= 0) return 0;
  return left > 3600 ? 3600 * 1000 : (int)ceil(left * 1000);
}

static void put_u32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static bool set_flags(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0 && fcntl(fd, F_SETFD, FD_CLOEXEC) == 0;
}

/* Sends all of buf on a non-blocking socket before the deadline. */
static bool send_all(int fd, const unsigned char *buf, size_t n, double deadline) {
  while (n > 0) {
    ssize_t k = send(fd, buf, n, MSG_NOSIGNAL);
    if (k > 0) {
      buf += k, n -= (size_t)k;
      continue;
    }
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    struct pollfd p = {fd, POLLOUT, 0};
    if (poll(&p, 1, ms_left(deadline)) <= 0 && now_s() >= deadline) return false;
  }
  return true;
}

/* ---- rank 0 */

/* Listens on every interface: an IPv6 socket that also takes IPv4 when the host has one,
 * else IPv4. */
static mn_status listen_on(int port, int backlog, int *out) {
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  struct addrinfo hints = {.ai_flags = AI_PASSIVE,
                           .ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM},
                  *list = NULL;
  int rc = getaddrinfo(NULL, service, &hints, &list);
  if (rc != 0)
    return mn_fail(MN_ERR_IO, "%s: rank 0 cannot listen on port %d: %s", FN, port,
                   gai_strerror(rc));
  int err = EADDRNOTAVAIL;
  for (int pass = 0; pass < 2; pass++)
    for (struct addrinfo *ai = list; ai; ai = ai->ai_next) {
      if ((ai->ai_family == AF_INET6) != (pass == 0)) continue;
      int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
      if (fd < 0) {
        err = errno;
        continue;
      }
      int one = 1, zero = 0;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, backlog) == 0 && set_flags(fd)) {
        freeaddrinfo(list);
        *out = fd;
        return MN_OK;
      }
      err = errno;
      close(fd);
    }
  freeaddrinfo(list);
  return mn_fail(MN_ERR_IO, "%s: rank 0 cannot listen on port %d: %s", FN, port, strerror(err));
}

typedef struct peer {
  int fd;
  size_t got;
  unsigned char hello[HELLO_BYTES];
} peer;

typedef struct server {
  int world_size, port;
  double timeout_s, deadline;
  const mn_group_id *id;
  bool *given; /* [world_size]: the ranks that have the id */
  int missing;
  peer *peers;
  size_t n_peers, cap;
} server;

static void drop(server *s, size_t i) {
  close(s->peers[i].fd);
  s->peers[i] = s->peers[--s->n_peers];
}

static void reply(server *s, int fd, uint32_t status, uint32_t value) {
  unsigned char out[REPLY_BYTES] = {0};
  put_u32(out, status);
  put_u32(out + 4, value);
  if (status == REPLY_OK) memcpy(out + 8, s->id->bytes, sizeof s->id->bytes);
  send_all(fd, out, sizeof out, s->deadline);
}

/* A whole hello from peer i: MN_OK with the peer served or dropped, else why rank 0 fails. */
static mn_status serve(server *s, size_t i) {
  const unsigned char *h = s->peers[i].hello;
  int fd = s->peers[i].fd;
  uint32_t rank = get_u32(h + 4), size = get_u32(h + 8);
  if (memcmp(h, "MNID", 4) != 0) {
    drop(s, i);
    return MN_OK;
  }
  if (size != (uint32_t)s->world_size) {
    reply(s, fd, REPLY_WORLD_SIZE, (uint32_t)s->world_size);
    drop(s, i);
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "%s: rank %u of %u ranks connected to rank 0 of %d ranks on port %d", FN, rank,
                   size, s->world_size, s->port);
  }
  if (rank < 1 || rank >= size) {
    drop(s, i);
    return MN_OK;
  }
  if (s->given[rank]) {
    reply(s, fd, REPLY_TWICE, rank);
    drop(s, i);
    return mn_fail(
        MN_ERR_INVALID_ARGUMENT,
        "%s: rank %u connected twice to rank 0 on port %d (two processes with one rank?)", FN, rank,
        s->port);
  }
  reply(s, fd, REPLY_OK, 0);
  s->given[rank] = true;
  s->missing--;
  drop(s, i);
  return MN_OK;
}

static void accept_all(server *s, int listener) {
  for (;;) {
    int fd = accept(listener, NULL, NULL);
    if (fd < 0) return;
    if (!set_flags(fd)) {
      close(fd);
      continue;
    }
    if (s->n_peers == s->cap) {
      size_t cap = s->cap ? 2 * s->cap : 8;
      peer *p = realloc(s->peers, cap * sizeof *p);
      if (!p) {
        close(fd);
        return;
      }
      s->peers = p, s->cap = cap;
    }
    s->peers[s->n_peers++] = (peer){.fd = fd};
  }
}

static mn_status timed_out(const server *s) {
  char list[256] = "";
  size_t len = 0;
  int named = 0;
  for (int r = 1; r < s->world_size && len < sizeof list; r++) {
    if (s->given[r]) continue;
    if (named++ == 16) {
      snprintf(list + len, sizeof list - len, ", ...");
      break;
    }
    len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", named > 1 ? ", " : "", r);
  }
  return mn_fail(MN_ERR_STATE, "%s: rank 0 waited %g s on port %d for rank(s) %s of %d", FN,
                 s->timeout_s, s->port, list, s->world_size);
}

static mn_status run_server(server *s, int listener) {
  struct pollfd *fds = NULL;
  mn_status st = MN_OK;
  while (s->missing > 0 && st == MN_OK) {
    if (now_s() >= s->deadline) {
      st = timed_out(s);
      break;
    }
    struct pollfd *grown = realloc(fds, (s->n_peers + 1) * sizeof *fds);
    if (!grown) {
      st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", FN);
      break;
    }
    fds = grown;
    fds[0] = (struct pollfd){listener, POLLIN, 0};
    for (size_t i = 0; i < s->n_peers; i++)
      fds[i + 1] = (struct pollfd){s->peers[i].fd, POLLIN, 0};
    size_t polled = s->n_peers;
    if (poll(fds, polled + 1, ms_left(s->deadline)) <= 0) continue;
    /* From the last: drop() moves the last peer into slot i, which was already looked at. */
    for (size_t i = polled; i-- > 0 && st == MN_OK;) {
      if (!fds[i + 1].revents) continue;
      peer *p = &s->peers[i];
      ssize_t k = recv(p->fd, p->hello + p->got, HELLO_BYTES - p->got, 0);
      if (k <= 0) {
        if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) drop(s, i);
        continue;
      }
      p->got += (size_t)k;
      if (p->got == HELLO_BYTES) st = serve(s, i);
    }
    if (fds[0].revents) accept_all(s, listener);
  }
  free(fds);
  return st;
}

static mn_status share_as_root(int port, int world_size, double timeout_s, double deadline,
                               const mn_group_id *id) {
  int listener = -1;
  mn_status st = listen_on(port, world_size < 64 ? 64 : world_size, &listener);
  if (st != MN_OK) return st;
  server s = {.world_size = world_size,
              .port = port,
              .timeout_s = timeout_s,
              .deadline = deadline,
              .id = id,
              .given = calloc((size_t)world_size, sizeof(bool)),
              .missing = world_size - 1};
  st = s.given ? run_server(&s, listener) : mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", FN);
  while (s.n_peers)
    drop(&s, 0);
  free(s.peers);
  free(s.given);
  close(listener);
  return st;
}

/* ---- the other ranks */

/* Receives exactly n bytes before the deadline; false on EOF, an error or the deadline. */
static bool recv_all(int fd, unsigned char *buf, size_t n, double deadline, const char **why) {
  while (n > 0) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, ms_left(deadline)) <= 0) {
      if (now_s() >= deadline) return *why = "rank 0 accepted but did not answer", false;
      continue;
    }
    ssize_t k = recv(fd, buf, n, 0);
    if (k == 0) return *why = "rank 0 closed the connection", false;
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return *why = strerror(errno), false;
    }
    buf += k, n -= (size_t)k;
  }
  return true;
}

/* One connection to one address of rank 0: MN_OK with the id, MN_ERR_NOT_FOUND to try again
 * (why says why), else rank 0's refusal. */
static mn_status ask(const struct addrinfo *ai, int rank, int world_size, double deadline,
                     const char *addr, int port, mn_group_id *id, const char **why) {
  int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
  if (fd < 0) return *why = strerror(errno), MN_ERR_NOT_FOUND;
  if (!set_flags(fd)) {
    *why = strerror(errno);
    close(fd);
    return MN_ERR_NOT_FOUND;
  }
  mn_status result = MN_ERR_NOT_FOUND;
  bool connected = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
  if (!connected && errno == EINPROGRESS) {
    /* At most 5 s per address: a filtered one must leave time for the next. */
    struct pollfd p = {fd, POLLOUT, 0};
    int err = ETIMEDOUT;
    socklen_t len = sizeof err;
    double until = now_s() + 5 < deadline ? now_s() + 5 : deadline;
    if (poll(&p, 1, ms_left(until)) > 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    connected = err == 0;
    if (!connected) *why = strerror(err);
  } else if (!connected) {
    *why = strerror(errno);
  }
  unsigned char hello[HELLO_BYTES], answer[REPLY_BYTES];
  memcpy(hello, "MNID", 4);
  put_u32(hello + 4, (uint32_t)rank);
  put_u32(hello + 8, (uint32_t)world_size);
  if (connected && !send_all(fd, hello, sizeof hello, deadline))
    *why = "cannot send to rank 0";
  else if (connected && recv_all(fd, answer, sizeof answer, deadline, why)) {
    uint32_t status = get_u32(answer), value = get_u32(answer + 4);
    if (status == REPLY_OK) {
      memcpy(id->bytes, answer + 8, sizeof id->bytes);
      result = MN_OK;
    } else if (status == REPLY_WORLD_SIZE) {
      result = mn_fail(MN_ERR_INVALID_ARGUMENT,
                       "%s: rank %d of %d ranks: rank 0 at %s:%d has a world size of %u", FN, rank,
                       world_size, addr, port, value);
    } else if (status == REPLY_TWICE) {
      result =
          mn_fail(MN_ERR_INVALID_ARGUMENT,
                  "%s: rank 0 at %s:%d already gave the id to a rank %u (two processes with one "
                  "rank?)",
                  FN, addr, port, value);
    } else {
      result = mn_fail(MN_ERR_STATE, "%s: rank 0 at %s:%d answered %u, not a group id", FN, addr,
                       port, status);
    }
  }
  close(fd);
  return result;
}

static mn_status share_as_peer(const char *addr, int port, int rank, int world_size,
                               double timeout_s, double deadline, mn_group_id *id) {
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *list = NULL;
  int rc = getaddrinfo(addr, service, &hints, &list);
  if (rc != 0)
    return mn_fail(MN_ERR_IO, "%s: rank %d cannot resolve rank 0's address \"%s\" (port %d): %s",
                   FN, rank, addr, port, gai_strerror(rc));
  const char *why = "no answer";
  for (;;) {
    for (struct addrinfo *ai = list; ai; ai = ai->ai_next) {
      mn_status st = ask(ai, rank, world_size, deadline, addr, port, id, &why);
      if (st != MN_ERR_NOT_FOUND) {
        freeaddrinfo(list);
        return st;
      }
    }
    int wait = ms_left(deadline);
    if (wait <= 0) break;
    struct timespec pause = {0, (wait < 50 ? wait : 50) * 1000L * 1000L};
    nanosleep(&pause, NULL);
  }
  freeaddrinfo(list);
  return mn_fail(MN_ERR_STATE, "%s: rank %d waited %g s for rank 0 at %s:%d (last: %s)", FN, rank,
                 timeout_s, addr, port, why);
}

mn_status mn_group_id_share_tcp(const char *master_addr, int master_port, int rank, int world_size,
                                double timeout_s, mn_group_id *id) {
  if (!id) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: id is NULL", FN);
  if (world_size < 1)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: world_size = %d, must be at least 1", FN,
                   world_size);
  if (rank < 0 || rank >= world_size)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: rank = %d outside [0, %d)", FN, rank, world_size);
  if (master_port < 1 || master_port > 65535)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: master_port = %d is not a port (1..65535)", FN,
                   master_port);
  if (rank > 0 && (!master_addr || !*master_addr))
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: rank %d needs rank 0's address (master_addr)", FN,
                   rank);
  if (world_size == 1) return MN_OK;
  double limit = timeout_s > 0 && isfinite(timeout_s) ? timeout_s : MN_GROUP_DEFAULT_TIMEOUT_S;
  double deadline = now_s() + limit;
  if (rank == 0) return share_as_root(master_port, world_size, limit, deadline, id);
  return share_as_peer(master_addr, master_port, rank, world_size, limit, deadline, id);
}
