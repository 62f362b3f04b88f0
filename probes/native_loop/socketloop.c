/*
 * socketloop.c — the TCP baseline's hot loops and the clock they time with, in C against
 * nothing but libc.
 *
 * Why C: a Python ping-pong costs more than a loopback or data-centre RTT, so the prober's
 * exchanges and the responder's echo run here, a whole loop per call from Python (cffi
 * releases the GIL for the duration). No libibverbs: the TCP probe runs on any host.
 *
 * The RDMA loops (probes/rdma/native/fastpath.c) time with the same clock, and report
 * its cost with fp_clock_overhead_ns from here.
 */

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/time.h>

static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* What the timing itself adds to every RTT sample: the median of ROUNDS back-to-back
 * clock reads (each sample is one pair of them around the exchange). */
int64_t fp_clock_overhead_ns(int rounds)
{
    int64_t d[1024];
    if (rounds < 1 || rounds > 1024)
        rounds = 1024;
    for (int i = 0; i < rounds; i++) {
        int64_t t0 = now_ns();
        d[i] = now_ns() - t0;
    }
    qsort(d, (size_t)rounds, sizeof d[0], cmp_i64);
    return d[rounds / 2];
}

/* The TCP responder's echo, for the TCP baseline: receive SIZE-byte messages on a
 * connected socket and send each back until the peer closes. Inside every RTT the
 * prober measures, so it is as lean as a C tool's. Returns the messages echoed, or
 * -errno (a receive timeout set with SO_RCVTIMEO gives -EAGAIN). */
int64_t fp_tcp_echo(int fd, uint8_t *buf, uint32_t size)
{
    int64_t echoed = 0;
    for (;;) {
        size_t got = 0, sent = 0;
        while (got < size) {
            ssize_t k = recv(fd, buf + got, size - got, MSG_WAITALL);
            if (k == 0)
                return echoed;
            if (k < 0) {
                if (errno == EINTR)
                    continue;
                return -errno;
            }
            got += (size_t)k;
        }
        while (sent < size) {
            ssize_t k = send(fd, buf + sent, size - sent, MSG_NOSIGNAL);
            if (k < 0) {
                if (errno == EINTR)
                    continue;
                return -errno;
            }
            sent += (size_t)k;
        }
        echoed++;
    }
}

/* fp_tcp_pingpong's outcomes besides 0 (all done) and -errno. */
#define FP_TCP_CLOSED 1   /* the peer closed the connection */
#define FP_TCP_TIMEOUT 2  /* an exchange passed its deadline */
#define FP_TCP_MISMATCH 3 /* the echo differed from what was sent */

/* Wait until FD is ready for EVENTS or DEADLINE (CLOCK_MONOTONIC ns) passes: 0 when
 * ready (or in error: the next call on FD says which), else an outcome or -errno. */
static int tcp_wait(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - now_ns();
        if (left <= 0)
            return FP_TCP_TIMEOUT;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, (int)((left + 999999) / 1000000));
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return -errno;
    }
}

/* The TCP baseline's prober: TOTAL ping-pongs of SIZE bytes on the connected socket FD,
 * each RTT (CLOCK_MONOTONIC, from before the send to after the echo's last byte) into
 * RTT_NS. Byte 0 of SBUF is SEQ0 + i (low byte) in exchange i, so a stale echo fails
 * VERIFY (the whole echo compared with what went out).
 *
 * Each exchange has STEP_NS. The send never blocks (MSG_DONTWAIT; poll for room when the
 * socket buffer is full). The echo is read with one blocking MSG_WAITALL recv, as a C
 * tool does it, bounded in the kernel by SO_RCVTIMEO (set here to STEP_NS); an echo that
 * comes in pieces is read on with poll() for what is left of the exchange's deadline.
 * Returns the exchanges done; *STATUS is 0 when all TOTAL are, else why it stopped:
 * FP_TCP_*, -errno, or -EINTR when a signal came (the exchange it came in is finished
 * and counted, so the caller can run its handlers and go on). */
int64_t fp_tcp_pingpong(int fd, uint8_t *sbuf, uint8_t *rbuf, uint32_t size, int64_t total,
                        int64_t step_ns, int verify, uint32_t seq0, int64_t *rtt_ns,
                        int *status)
{
    *status = 0;
    if (size == 0 || total < 0 || step_ns <= 0) {
        *status = -EINVAL;
        return 0;
    }
    struct timeval tv = {.tv_sec = step_ns / 1000000000,
                         .tv_usec = (step_ns % 1000000000) / 1000};
    if (tv.tv_sec == 0 && tv.tv_usec == 0)
        tv.tv_usec = 1; /* zero would mean no timeout at all */
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) {
        *status = -errno;
        return 0;
    }
    int interrupted = 0;
    for (int64_t i = 0; i < total; i++) {
        sbuf[0] = (uint8_t)(seq0 + (uint32_t)i);
        int64_t t0 = now_ns(), deadline = t0 + step_ns;
        size_t sent = 0, got = 0;
        int st = 0, flags = MSG_WAITALL; /* the first read blocks; later ones follow a poll */
        while (sent < size && !st) {
            ssize_t k = send(fd, sbuf + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k >= 0)
                sent += (size_t)k;
            else if (errno == EINTR)
                interrupted = 1;
            else if (errno == EAGAIN || errno == EWOULDBLOCK)
                st = tcp_wait(fd, POLLOUT, deadline);
            else
                st = -errno;
        }
        while (got < size && !st) {
            ssize_t k = recv(fd, rbuf + got, size - got, flags);
            if (k == 0) {
                st = FP_TCP_CLOSED;
                break;
            }
            if (k > 0)
                got += (size_t)k;
            else if (errno == EINTR)
                interrupted = 1; /* finish this exchange, then let the caller see it */
            else if (errno != EAGAIN && errno != EWOULDBLOCK)
                st = -errno;
            if (got < size && !st) {
                st = tcp_wait(fd, POLLIN, deadline);
                flags = MSG_DONTWAIT;
            }
        }
        if (st) {
            *status = st;
            return i;
        }
        rtt_ns[i] = now_ns() - t0;
        if (verify && memcmp(sbuf, rbuf, size) != 0) {
            *status = FP_TCP_MISMATCH;
            return i;
        }
        if (interrupted) {
            *status = -EINTR;
            return i + 1;
        }
    }
    return total;
}
