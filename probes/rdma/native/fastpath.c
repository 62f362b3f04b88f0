/*
 * fastpath.c — the RC and UD probes' hot loops, in C against libibverbs.
 *
 * Why C: under the lane's emulation each Python-level verbs call costs more than the
 * fabric's own latency, and pyverbs exposes no raw pointers, so this file owns its verbs
 * resources (context, PD, send CQ, receive CQ, one MR, one RC or UD QP) and runs a whole
 * loop per call from Python (cffi releases the GIL for the duration).
 *
 * RC: the MR holds 2 x size bytes: [0, size) is sent from, [size, 2 size) is received and
 * RDMA-written into. `depth` receives are posted from the start and one is re-posted
 * after each that completes. Sends are signaled every `signal_every` (and the last one of
 * a loop); a signaled completion retires the unsignaled WRs posted before it. UD: the MR
 * holds `depth` receive slots (GRH + message) and one send slot; every send is signaled.
 *
 * Every loop takes a per-step deadline (CLOCK_MONOTONIC), allocates nothing, and returns
 * the number of iterations completed: fewer only at a deadline, on a completion error
 * (kept in the endpoint for the message) or when fp_stop() asked it to end.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <infiniband/verbs.h>

#define SIGNAL_EVERY 16
/* UD probing (probes/rdma/ud.py has the protocol): a message is magic, kind, seq, value,
 * big-endian ("!IIIQ", 20 bytes); every receive slot starts with the 40-byte GRH. */
#define UD_MAGIC 0xFB0DD0D0u
#define UD_PROBE 1
#define UD_ACK1 2
#define UD_ACK2 3
#define UD_MSG 20
#define UD_GRH 40
#define UD_SLOT (UD_GRH + UD_MSG)
#define CLOCK_EVERY 64 /* empty polls between two clock reads */
/* A wait busy-polls for SPIN_NS, as answers of a working fabric, queueing included, come
 * well inside it, then polls every PAUSE_NS: a lost message, or a peer that is slow or
 * gone, costs a few % of a core until the deadline instead of all of it, and an answer
 * that late is seen at most PAUSE_NS (plus the timer's slack, set to 1 ns for the loops'
 * thread) after it came. An endpoint given its own spin (fp_set_spin) busy-polls that
 * long, and then a wait for a receive completion sleeps until the receive CQ's
 * completion event (BLOCK_NS at most at a time, so that a stop is seen): next to no CPU,
 * where many loops share few CPUs. A completion that comes during the sleep raises the
 * event as it is queued, and nothing was seen before the sleep: so the loop takes its
 * wake-up, less the time the thread then waited for a CPU (the run-queue wait its
 * /proc/thread-self/schedstat adds up), as the point past which it can have seen the
 * answer late. The time between the completion and the event (the kernel's) counts as
 * the path's; without schedstat, the wake-up's own wait for a CPU does too. */
#define SPIN_NS 5000000
#define PAUSE_NS 50000
#define BLOCK_NS 10000000
#define POLL_BATCH 16

struct fp_info {
    uint32_t qpn, psn, rkey, gid_index, active_mtu, inline_size;
    uint64_t addr; /* the receive half, where the peer's RDMA WRITEs land */
    uint8_t gid[16];
};

typedef struct fp_ep {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *send_cq, *recv_cq;
    struct ibv_comp_channel *chan; /* the receive CQ's completion events (NULL: none) */
    int64_t spin_ns;    /* how long a wait busy-polls before it sleeps or pauses */
    int sleeps;         /* past it, receive waits sleep on completion events (fp_set_spin) */
    struct ibv_mr *mr;
    struct ibv_qp *qp;
    struct ibv_ah *ah;  /* UD: towards the peer (fp_ud_remote) */
    uint32_t remote_qpn, qkey;
    int hw_ts;          /* UD: the device has completion timestamps */
    uint8_t *buf;
    uint32_t size, depth, port, psn, gid_index, active_mtu, inline_size, signal_every;
    union ibv_gid gid;
    struct ibv_sge recv_sge;
    struct ibv_recv_wr recv_wr;
    int connected;
    int stop;           /* set by fp_stop() from another thread; read with __atomic */
    int sq_used;        /* send WRs posted and not yet retired by a completion */
    int since_signal;   /* unsignaled WRs posted since the last signaled one */
    int wc_status;      /* last completion error (enum ibv_wc_status), 0 if none */
    int err_no;         /* errno of the last failed call, 0 if none */
    char err[256];
} fp_ep;

/* ------------------------------------------------------------------------ helpers */

static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Keep ERR (an errno, or EIO when the library left none) and a message; returns -1. */
static int fail(fp_ep *ep, int err, const char *fmt, ...)
{
    va_list ap;
    ep->err_no = err ? err : EIO;
    va_start(ap, fmt);
    int n = vsnprintf(ep->err, sizeof ep->err, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof ep->err)
        snprintf(ep->err + n, sizeof ep->err - n, ": %s", strerror(ep->err_no));
    return -1;
}

static int wc_fail(fp_ep *ep, const struct ibv_wc *wc, const char *cq)
{
    ep->wc_status = wc->status;
    snprintf(ep->err, sizeof ep->err,
             "QP %u: %s completion error: %s (status %d, opcode %d, vendor_err 0x%x)",
             ep->qp->qp_num, cq, ibv_wc_status_str(wc->status), wc->status, wc->opcode,
             wc->vendor_err);
    return -1;
}

static void clear_error(fp_ep *ep)
{
    ep->wc_status = ep->err_no = 0;
    ep->err[0] = '\0';
}

static inline int stopped(const fp_ep *ep)
{
    return __atomic_load_n(&ep->stop, __ATOMIC_RELAXED);
}

static int mtu_enum(uint32_t bytes) /* 256 -> IBV_MTU_256 (1) ... 4096 -> IBV_MTU_4096 (5) */
{
    for (int e = IBV_MTU_256; e <= IBV_MTU_4096; e++)
        if (128u << e == bytes)
            return e;
    return 0;
}

/* Index of the first RoCE v2 GID holding an IPv4-mapped address (what rdma_cm picks). */
static int roce_v2_gid_index(fp_ep *ep, int table_len)
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    struct ibv_gid_entry entry;
    for (int i = 0; i < table_len; i++) {
        if (ibv_query_gid_ex(ep->ctx, ep->port, i, &entry, 0))
            continue; /* empty slots answer ENODATA */
        if (entry.gid_type == IBV_GID_TYPE_ROCE_V2 && !memcmp(entry.gid.raw, v4mapped, 12))
            return i;
    }
    return -1;
}

/* ------------------------------------------------------------------- the resources */

fp_ep *fp_new(void) { return calloc(1, sizeof(fp_ep)); }

const char *fp_error(const fp_ep *ep) { return ep->err; }
int fp_errno(const fp_ep *ep) { return ep->err_no; }
int fp_wc_status(const fp_ep *ep) { return ep->wc_status; }

/* Ask a loop running in another thread to return at its next check (within µs, or a
 * BLOCK_NS sleep). */
void fp_stop(fp_ep *ep) { __atomic_store_n(&ep->stop, 1, __ATOMIC_RELAXED); }

/* How long this endpoint's waits busy-poll before receive waits sleep on completion
 * events (0 ns .. 1 s); without a call they busy-poll SPIN_NS, then pause. */
int fp_set_spin(fp_ep *ep, int64_t spin_ns)
{
    if (spin_ns < 0 || spin_ns > 1000000000)
        return fail(ep, EINVAL, "spin %lld ns outside 0..1 s", (long long)spin_ns);
    ep->spin_ns = spin_ns;
    ep->sleeps = 1;
    return 0;
}

/* Release QP, AH, MR, CQs, PD, context, in that order; safe to call twice. */
void fp_close(fp_ep *ep)
{
    if (ep->qp) ibv_destroy_qp(ep->qp);
    if (ep->ah) ibv_destroy_ah(ep->ah);
    if (ep->mr) ibv_dereg_mr(ep->mr);
    if (ep->send_cq) ibv_destroy_cq(ep->send_cq);
    if (ep->recv_cq) ibv_destroy_cq(ep->recv_cq);
    if (ep->chan) ibv_destroy_comp_channel(ep->chan);
    if (ep->pd) ibv_dealloc_pd(ep->pd);
    if (ep->ctx) ibv_close_device(ep->ctx);
    free(ep->buf);
    ep->qp = NULL, ep->ah = NULL, ep->mr = NULL, ep->send_cq = ep->recv_cq = NULL;
    ep->chan = NULL;
    ep->pd = NULL, ep->ctx = NULL, ep->buf = NULL;
    ep->connected = 0;
}

void fp_free(fp_ep *ep)
{
    if (ep) {
        fp_close(ep);
        free(ep);
    }
}

static int open_device(fp_ep *ep, const char *name)
{
    int num = 0;
    struct ibv_device **list = ibv_get_device_list(&num);
    if (!list)
        return fail(ep, errno, "%s: no RDMA devices on this host (ibv_get_device_list)", name);
    char seen[128] = "";
    for (int i = 0; i < num && !ep->ctx; i++) {
        const char *dev = ibv_get_device_name(list[i]);
        if (strcmp(dev, name) == 0) {
            ep->ctx = ibv_open_device(list[i]);
            if (!ep->ctx)
                fail(ep, errno, "%s: ibv_open_device", name);
        } else {
            size_t used = strlen(seen);
            snprintf(seen + used, sizeof seen - used, "%s%s", used ? ", " : "", dev);
        }
    }
    ibv_free_device_list(list);
    if (!ep->ctx && !ep->err_no)
        fail(ep, ENODEV, "%s: no RDMA device of that name (devices here: %s)", name,
             num ? seen : "none");
    return ep->ctx ? 0 : -1;
}

/* The ladder's common steps: open DEVICE, read PORT (active MTU) and the GID at
 * GID_INDEX (< 0: the first IPv4 RoCE v2 GID), allocate the PD and a send and a receive
 * CQ of CQE entries. -1 with the error kept (the caller releases what was made). */
static int open_common(fp_ep *ep, const char *device, uint32_t port, int gid_index, int cqe)
{
    struct ibv_port_attr pattr;
    int rc;
    if (open_device(ep, device))
        return -1;
    if ((rc = ibv_query_port(ep->ctx, port, &pattr)))
        return fail(ep, rc, "%s: ibv_query_port %u", device, port);
    ep->active_mtu = 128u << pattr.active_mtu;
    if (gid_index < 0 && (gid_index = roce_v2_gid_index(ep, pattr.gid_tbl_len)) < 0)
        return fail(ep, EOPNOTSUPP, "%s port %u: no RoCE v2 GID for an IPv4 address", device,
                    port);
    ep->gid_index = gid_index;
    if ((rc = ibv_query_gid(ep->ctx, port, gid_index, &ep->gid)))
        return fail(ep, errno ? errno : rc, "%s: ibv_query_gid %d", device, gid_index);
    if (!(ep->pd = ibv_alloc_pd(ep->ctx)))
        return fail(ep, errno, "%s: ibv_alloc_pd", device);
    ep->spin_ns = SPIN_NS;
    /* a provider without completion events leaves the long waits pausing */
    ep->chan = ibv_create_comp_channel(ep->ctx);
    if (ep->chan) {
        int fl = fcntl(ep->chan->fd, F_GETFL);
        if (fl < 0 || fcntl(ep->chan->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
            ibv_destroy_comp_channel(ep->chan);
            ep->chan = NULL;
        }
    }
    /* both CQs raise events on the one channel; only a CQ a wait asks (arms) raises any */
    ep->send_cq = ibv_create_cq(ep->ctx, cqe, NULL, ep->chan, 0);
    ep->recv_cq = ibv_create_cq(ep->ctx, cqe, NULL, ep->chan, 0);
    if (!ep->send_cq || !ep->recv_cq)
        return fail(ep, errno, "%s: ibv_create_cq", device);
    return 0;
}

/* Create the QP asking for INLINE bytes of inline data; fall back to none. */
static int create_qp(fp_ep *ep, uint32_t inline_want)
{
    struct ibv_qp_init_attr init = {
        .send_cq = ep->send_cq,
        .recv_cq = ep->recv_cq,
        .cap = {.max_send_wr = ep->depth, .max_recv_wr = ep->depth,
                .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = inline_want},
        .qp_type = IBV_QPT_RC,
    };
    ep->qp = ibv_create_qp(ep->pd, &init);
    if (!ep->qp && inline_want) {
        init.cap.max_inline_data = 0;
        ep->qp = ibv_create_qp(ep->pd, &init);
    }
    if (!ep->qp)
        return fail(ep, errno, "ibv_create_qp");
    ep->inline_size = init.cap.max_inline_data; /* what the provider granted */
    return 0;
}

static int post_recv(fp_ep *ep)
{
    struct ibv_recv_wr *bad;
    int rc = ibv_post_recv(ep->qp, &ep->recv_wr, &bad);
    return rc ? fail(ep, rc, "QP %u: ibv_post_recv", ep->qp->qp_num) : 0;
}

/* Open DEVICE and build the ladder up to a QP in INIT with DEPTH receives posted.
 * GID_INDEX < 0 picks the first IPv4 RoCE v2 GID. On failure everything is released. */
int fp_open(fp_ep *ep, const char *device, uint32_t size, uint32_t depth, uint32_t port,
            int gid_index, int remote_access, uint32_t inline_want, uint32_t psn)
{
    int rc, access = IBV_ACCESS_LOCAL_WRITE;
    long page = sysconf(_SC_PAGESIZE);

    clear_error(ep);
    if (ep->ctx)
        return fail(ep, EBUSY, "%s: endpoint already open", device);
    if (size < 1 || depth < 2)
        return fail(ep, EINVAL, "%s: size %u / depth %u too small", device, size, depth);
    ep->size = size, ep->depth = depth, ep->port = port, ep->psn = psn & 0xffffff;
    ep->signal_every = depth >= 2 * SIGNAL_EVERY ? SIGNAL_EVERY : (depth + 1) / 2;
    /* CQs of twice the depth: a QP in error flushes every posted WR, signaled or not */
    if (open_common(ep, device, port, gid_index, 2 * (int)depth))
        goto out;
    if ((rc = posix_memalign((void **)&ep->buf, page, 2 * (size_t)size))) {
        fail(ep, rc, "%s: allocating 2 x %u bytes", device, size);
        goto out;
    }
    memset(ep->buf, 0, 2 * (size_t)size); /* the WRITE poller waits for a non-zero byte */
    if (remote_access)
        access |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (!(ep->mr = ibv_reg_mr(ep->pd, ep->buf, 2 * (size_t)size, access))) {
        fail(ep, errno, "%s: ibv_reg_mr of 2 x %u bytes", device, size);
        goto out;
    }
    if (create_qp(ep, inline_want))
        goto out;
    struct ibv_qp_attr attr = {
        .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = port, .qp_access_flags = access,
    };
    rc = ibv_modify_qp(ep->qp, &attr,
                       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc) {
        fail(ep, rc, "%s: QP %u to INIT", device, ep->qp->qp_num);
        goto out;
    }
    ep->recv_sge = (struct ibv_sge){(uintptr_t)(ep->buf + size), size, ep->mr->lkey};
    ep->recv_wr = (struct ibv_recv_wr){.wr_id = 2, .sg_list = &ep->recv_sge, .num_sge = 1};
    for (uint32_t i = 0; i < depth; i++) /* receives may be posted from INIT on */
        if (post_recv(ep))
            goto out;
    return 0;
out:
    fp_close(ep);
    return -1;
}

int fp_info(const fp_ep *ep, struct fp_info *out)
{
    if (!ep->qp)
        return -1;
    out->qpn = ep->qp->qp_num, out->psn = ep->psn, out->rkey = ep->mr->rkey;
    out->gid_index = ep->gid_index, out->active_mtu = ep->active_mtu;
    out->inline_size = ep->inline_size;
    out->addr = (uintptr_t)(ep->buf + ep->size);
    memcpy(out->gid, ep->gid.raw, 16);
    return 0;
}

/* INIT -> RTR -> RTS towards the peer's QPN/PSN/GID; the path MTU is the smaller of the
 * two active MTUs. Timers as the pyverbs endpoint: RNR 0.01 ms, ACK timeout 67 ms x 7. */
int fp_connect(fp_ep *ep, uint32_t qpn, uint32_t psn, const uint8_t *gid, uint32_t mtu)
{
    clear_error(ep);
    if (!ep->qp)
        return fail(ep, EBADF, "endpoint is closed");
    if (!mtu_enum(mtu))
        return fail(ep, EINVAL, "path MTU %u is not an IB MTU", mtu);
    struct ibv_qp_attr attr = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = mtu_enum(mtu < ep->active_mtu ? mtu : ep->active_mtu),
        .dest_qp_num = qpn,
        .rq_psn = psn,
        .max_dest_rd_atomic = 1,
        .min_rnr_timer = 1,
        .ah_attr = {.is_global = 1, .port_num = ep->port,
                    .grh = {.sgid_index = ep->gid_index, .hop_limit = 64}},
    };
    memcpy(attr.ah_attr.grh.dgid.raw, gid, 16);
    int rc = ibv_modify_qp(ep->qp, &attr,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                               IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc)
        return fail(ep, rc, "QP %u to RTR", ep->qp->qp_num);
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn = ep->psn;
    attr.timeout = 14;   /* 4.096 us x 2^14 = 67 ms per transport retry */
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;  /* forever on RNR: the loop's deadline bounds it */
    attr.max_rd_atomic = 1;
    rc = ibv_modify_qp(ep->qp, &attr,
                       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                           IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc)
        return fail(ep, rc, "QP %u to RTS", ep->qp->qp_num);
    ep->connected = 1;
    return 0;
}

/* ------------------------------------------------------------------ send side */

/* Post WR, signaled or not; a signaled WR's wr_id says how many WRs its completion retires. */
static int post_send(fp_ep *ep, struct ibv_send_wr *wr, int signaled)
{
    struct ibv_send_wr *bad;
    ep->since_signal++;
    if (signaled) {
        wr->send_flags |= IBV_SEND_SIGNALED;
        wr->wr_id = ep->since_signal;
        ep->since_signal = 0;
    } else {
        wr->send_flags &= ~IBV_SEND_SIGNALED;
    }
    int rc = ibv_post_send(ep->qp, wr, &bad);
    if (rc)
        return fail(ep, rc, "QP %u: ibv_post_send", ep->qp->qp_num);
    ep->sq_used++;
    return 0;
}

/* One poll of the send CQ: >= 0 completions reaped, -1 on an error completion. */
static int reap_send(fp_ep *ep)
{
    struct ibv_wc wc[POLL_BATCH];
    int n = ibv_poll_cq(ep->send_cq, POLL_BATCH, wc);
    if (n < 0)
        return fail(ep, EIO, "QP %u: polling the send CQ", ep->qp->qp_num);
    for (int i = 0; i < n; i++) {
        if (wc[i].status != IBV_WC_SUCCESS)
            return wc_fail(ep, &wc[i], "send");
        ep->sq_used -= (int)wc[i].wr_id;
    }
    return n;
}

struct spin {
    unsigned polls;     /* empty polls so far */
    int64_t since;      /* the wait's first clock read (0: none yet) */
    int64_t last;       /* its newest clock read, just after an empty poll (0: none yet) */
    int pausing;
    struct ibv_cq *cq;  /* a receive wait: the CQ whose events it may sleep on (or NULL) */
    int armed;          /* its event is asked for, and not yet taken */
    int woke;           /* it slept since the last look: LAST is the wake-up's */
};

/* The calling thread's time spent runnable but waiting for a CPU (ns), -1 if the kernel
 * does not keep it (schedstat's second field; CONFIG_SCHED_INFO). */
static int64_t run_queue_ns(void)
{
    char b[96];
    int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, b, sizeof b - 1);
    close(fd);
    if (n <= 0)
        return -1;
    b[n] = 0;
    unsigned long long ran, waited;
    if (sscanf(b, "%llu %llu", &ran, &waited) != 2)
        return -1;
    return (int64_t)waited;
}

/* Sleep until the receive CQ's next completion event, DEADLINE or BLOCK_NS from NOW. The
 * first call only asks for the event: a completion that came before the ask raises
 * none, so the caller polls once more before the next call sleeps. */
static void sleep_on_cq(fp_ep *ep, struct spin *s, int64_t now, int64_t deadline)
{
    if (!s->armed) {
        if (ibv_req_notify_cq(s->cq, 0) == 0)
            s->armed = 1;
        else
            s->cq = NULL; /* no events from this CQ: pause instead */
        return;
    }
    int64_t left = deadline - now;
    if (left > BLOCK_NS)
        left = BLOCK_NS;
    struct timespec ts = {left / 1000000000, left % 1000000000};
    struct pollfd p = {.fd = ep->chan->fd, .events = POLLIN};
    int64_t q0 = run_queue_ns();
    int got = ppoll(&p, 1, &ts, NULL);
    int64_t woke = now_ns(), q1 = run_queue_ns();
    /* no completion was seen before it: the wake-up is the wait's newest look, less the
     * wait for a CPU that followed the event (or the timer) */
    s->last = woke - (q0 >= 0 && q1 >= q0 ? q1 - q0 : 0);
    s->woke = 1;
    if (got > 0) {
        struct ibv_cq *cq;
        void *ctx;
        if (ibv_get_cq_event(ep->chan, &cq, &ctx) == 0) {
            ibv_ack_cq_events(cq, 1);
            s->armed = 0; /* an event (maybe an earlier wait's): poll, then ask again */
        }
    }
}

/* After an empty poll: 0 to poll again at once, 1 to poll again after the caller's
 * periodic work (a clock check was due), -1 once DEADLINE has passed or a stop was asked.
 * Once the wait is older than the endpoint's spin it sleeps on the receive CQ's events
 * (a receive wait on an endpoint set to sleep, with events) or pauses PAUSE_NS first. */
static int spin_on(fp_ep *ep, struct spin *s, int64_t deadline)
{
    if (!s->pausing && ++s->polls % CLOCK_EVERY)
        return 0;
    int64_t now = now_ns();
    s->last = now;
    if (now > deadline || stopped(ep))
        return -1;
    if (!s->since)
        s->since = now;
    if (!s->pausing && now - s->since < ep->spin_ns)
        return 1;
    s->pausing = 1;
    if (s->cq && ep->chan && ep->sleeps) {
        sleep_on_cq(ep, s, now, deadline);
        return 1;
    }
    struct timespec pause = {0, PAUSE_NS};
    nanosleep(&pause, NULL);
    return 1;
}

/* Wait until at most LIMIT send WRs are outstanding: 1 done, 0 deadline/stop, -1 error.
 * With SEEN (not NULL) the wait is an answer's (an RDMA READ's data): it may sleep on the
 * send CQ's events as a receive wait does on its own, and SEEN gets the wait's last clock
 * read after an empty poll (0: none), as wait_recv's. */
static int wait_send_seen(fp_ep *ep, int limit, int64_t deadline, int64_t *seen)
{
    struct spin s = {.cq = seen ? ep->send_cq : NULL};
    while (ep->sq_used > limit) {
        if (reap_send(ep) < 0)
            return -1;
        if (ep->sq_used > limit && spin_on(ep, &s, deadline) < 0)
            return 0;
    }
    if (seen)
        *seen = s.last;
    return 1;
}

static int wait_send(fp_ep *ep, int limit, int64_t deadline)
{
    return wait_send_seen(ep, limit, deadline, NULL);
}

/* Wait for one receive completion and re-post it: 1 got one, 0 deadline/stop, -1 error.
 * SEEN (may be NULL) gets the wait's last clock read after an empty poll (0: none). */
static int wait_recv(fp_ep *ep, int64_t deadline, int64_t *seen)
{
    struct ibv_wc wc;
    struct spin s = {.cq = ep->recv_cq};
    for (;;) {
        int n = ibv_poll_cq(ep->recv_cq, 1, &wc);
        if (n > 0) {
            if (seen)
                *seen = s.last;
            if (wc.status == IBV_WC_SUCCESS)
                return post_recv(ep) ? -1 : 1;
            /* a flush names no cause; the send CQ usually holds the real error */
            if (wc.status == IBV_WC_WR_FLUSH_ERR && reap_send(ep) < 0)
                return -1;
            return wc_fail(ep, &wc, "receive");
        }
        if (n < 0)
            return fail(ep, EIO, "QP %u: polling the receive CQ", ep->qp->qp_num);
        int r = spin_on(ep, &s, deadline);
        if (r < 0)
            return 0;
        if (r && reap_send(ep) < 0) /* a peer that vanished shows up here first */
            return -1;
    }
}

/* Spin on a byte of the receive half until the peer's WRITE puts MARK there; SEEN as
 * wait_recv's. */
static int wait_mark(fp_ep *ep, const uint8_t *where, uint8_t mark, int64_t deadline,
                     int64_t *seen)
{
    struct spin s = {0};
    while (__atomic_load_n(where, __ATOMIC_ACQUIRE) != mark) {
        int r = spin_on(ep, &s, deadline);
        if (r < 0)
            return 0;
        if (r && reap_send(ep) < 0)
            return -1;
    }
    if (seen)
        *seen = s.last;
    return 1;
}

static int wait_answer(fp_ep *ep, int write, const uint8_t *in_mark, uint8_t mark,
                       int64_t deadline, int64_t *seen)
{
    return write ? wait_mark(ep, in_mark, mark, deadline, seen)
                 : wait_recv(ep, deadline, seen);
}

/* Pauses between polls end when asked, not up to the default 50 us later. */
static void precise_pauses(void) { prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL); }

/* Checks shared by the loops (RC and UD); SIZE must fit the buffer, the QP must be
 * connected (UD: have its peer's address handle). */
static int loop_ready(fp_ep *ep, uint32_t size)
{
    precise_pauses();
    clear_error(ep);
    ep->sq_used = ep->since_signal = 0;
    if (!ep->connected)
        return fail(ep, ENOTCONN, "endpoint is not connected");
    if (size < 1 || size > ep->size)
        return fail(ep, EINVAL, "message size %u outside 1..%u", size, ep->size);
    return 0;
}

/* Retire what is still outstanding so the last message is known to have landed. */
static int drain(fp_ep *ep, int64_t step_ns)
{
    return wait_send(ep, 0, now_ns() + step_ns);
}

/* ------------------------------------------------------------------ the loops */

/* Round trip I's RTT (T0 to T1) into RTT_NS, and into PROBER_NS how late the prober can
 * have seen its answer: from SEEN, the wait's last clock read after an empty poll (or T0
 * when it read none after T0). Either may be NULL. */
static inline void keep_sample(int64_t *rtt_ns, int64_t *prober_ns, int64_t i, int64_t t0,
                               int64_t t1, int64_t seen)
{
    if (rtt_ns)
        rtt_ns[i] = t1 - t0;
    if (prober_ns)
        prober_ns[i] = t1 - (seen > t0 ? seen : t0);
}

/* The ping-pong both latency loops share. FIRST posts and waits for the answer; the other
 * side waits and answers. A SEND is answered by a receive completion; a WRITE by the marker
 * i % 255 + 1 landing in the last byte of the receive half (perftest's write_lat method).
 * RTT_NS (may be NULL) gets each round trip in ns, from the clock read just before the
 * post (the wait for room in the send queue comes before it) to the one after the answer.
 * PROBER_NS (may be NULL) gets how late the prober can have seen its answer: the time
 * from the wait's last clock read after an empty poll (read every CLOCK_EVERY polls: no
 * clock read is added to the wait) to the one after the answer, or the whole RTT when
 * the wait read none. A thread descheduled while its answer came, or pausing in a long
 * wait, has that time in it. */
static int64_t pingpong(fp_ep *ep, struct ibv_send_wr *wr, uint32_t size, int64_t total,
                        int first, int64_t step_ns, int64_t *rtt_ns, int64_t *prober_ns)
{
    int write = wr->opcode == IBV_WR_RDMA_WRITE, every = ep->signal_every;
    uint8_t *out_mark = ep->buf + size - 1;
    const uint8_t *in_mark = ep->buf + ep->size + size - 1;
    for (int64_t i = 0; i < total; i++) {
        uint8_t mark = (uint8_t)(i % 255 + 1);
        int signaled = i % every == every - 1 || i == total - 1;
        int64_t t0 = now_ns(), deadline = t0 + step_ns, seen = 0;
        if (stopped(ep) ||
            (!first && wait_answer(ep, write, in_mark, mark, deadline, NULL) <= 0))
            return i;
        *out_mark = mark;
        if (wait_send(ep, ep->depth - 1, deadline) <= 0)
            return i;
        if (first) /* the RTT starts at the post, as perftest's: room in the SQ is not it */
            t0 = now_ns();
        if (post_send(ep, wr, signaled))
            return i;
        if (first && wait_answer(ep, write, in_mark, mark, deadline, &seen) <= 0)
            return i;
        keep_sample(rtt_ns, prober_ns, i, t0, now_ns(), seen);
        if (reap_send(ep) < 0)
            return first ? i + 1 : i;
    }
    /* the answering side's last message counts once it is acknowledged */
    return drain(ep, step_ns) > 0 || first ? total : total - 1;
}

int64_t fp_send_pingpong(fp_ep *ep, uint32_t size, int64_t total, int first, int64_t step_ns,
                         int64_t *rtt_ns, int64_t *prober_ns)
{
    if (loop_ready(ep, size))
        return 0;
    struct ibv_sge sge = {(uintptr_t)ep->buf, size, ep->mr->lkey};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = size <= ep->inline_size ? IBV_SEND_INLINE : 0};
    return pingpong(ep, &wr, size, total, first, step_ns, rtt_ns, prober_ns);
}

/* RADDR/RKEY: the peer's receive half. Both ends need remote write access. */
int64_t fp_write_pingpong(fp_ep *ep, uint64_t raddr, uint32_t rkey, uint32_t size,
                          int64_t total, int first, int64_t step_ns, int64_t *rtt_ns,
                          int64_t *prober_ns)
{
    if (loop_ready(ep, size))
        return 0;
    struct ibv_sge sge = {(uintptr_t)ep->buf, size, ep->mr->lkey};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags = size <= ep->inline_size ? IBV_SEND_INLINE : 0,
                             .wr.rdma = {.remote_addr = raddr, .rkey = rkey}};
    return pingpong(ep, &wr, size, total, first, step_ns, rtt_ns, prober_ns);
}

/* One-sided latency (perftest's read_lat method): TOTAL RDMA READs of SIZE bytes from the
 * peer's RADDR/RKEY (its receive half, registered with remote access), one at a time,
 * each signaled; its completion means the data came back. No software on the peer takes
 * part: the RTT is the two NICs' and the path's, and this host's own delay in seeing the
 * completion (PROBER_NS, as pingpong's). RTT_NS and PROBER_NS as pingpong's. */
int64_t fp_read_probe(fp_ep *ep, uint64_t raddr, uint32_t rkey, uint32_t size, int64_t total,
                      int64_t step_ns, int64_t *rtt_ns, int64_t *prober_ns)
{
    if (loop_ready(ep, size))
        return 0;
    struct ibv_sge sge = {(uintptr_t)(ep->buf + ep->size), size, ep->mr->lkey};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
                             .wr.rdma = {.remote_addr = raddr, .rkey = rkey}};
    for (int64_t i = 0; i < total; i++) {
        int64_t t0 = now_ns(), seen = 0;
        if (stopped(ep) || post_send(ep, &wr, 1))
            return i;
        if (wait_send_seen(ep, 0, t0 + step_ns, &seen) <= 0)
            return i;
        keep_sample(rtt_ns, prober_ns, i, t0, now_ns(), seen);
    }
    return total;
}

/* Bandwidth: ITERS operations of SIZE bytes (WRITE into RADDR/RKEY when WRITE, else
 * SEND), OUTSTANDING in flight, every one signaled. Returns completions; ELAPSED_NS gets
 * the time from the first post to the last completion. The deadline restarts on progress. */
int64_t fp_bandwidth(fp_ep *ep, int write, uint64_t raddr, uint32_t rkey, uint32_t size,
                     int64_t iters, uint32_t outstanding, int64_t step_ns, int64_t *elapsed_ns)
{
    int64_t posted = 0, completed = 0, t0 = now_ns(), deadline = t0 + step_ns;
    *elapsed_ns = 0;
    if (loop_ready(ep, size))
        return 0;
    if (outstanding < 1 || outstanding > ep->depth) {
        fail(ep, EINVAL, "outstanding %u outside 1..%u", outstanding, ep->depth);
        return 0;
    }
    struct ibv_sge sge = {(uintptr_t)ep->buf, size, ep->mr->lkey};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1,
                             .opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_SEND,
                             .send_flags = size <= ep->inline_size ? IBV_SEND_INLINE : 0,
                             .wr.rdma = {.remote_addr = raddr, .rkey = rkey}};
    for (unsigned spins = 1; completed < iters && !stopped(ep); spins++) {
        while (posted < iters && posted - completed < outstanding) {
            if (post_send(ep, &wr, 1))
                goto out;
            posted++;
        }
        int n = reap_send(ep);
        if (n < 0)
            break;
        if (n > 0) {
            completed += n;
            deadline = now_ns() + step_ns;
        } else if (spins % CLOCK_EVERY == 0 && now_ns() > deadline) {
            break;
        }
    }
out:
    *elapsed_ns = now_ns() - t0;
    return completed;
}

/* The receiving side of SEND bandwidth: count ITERS receives, re-posting each. It times
 * nothing, so a wait past its spin sleeps on the receive CQ's events whatever the
 * endpoint's setting: pausing PAUSE_NS between polls instead, each pause's timer wake-up
 * took the CPU from the transport, and in the soft-RoCE lane, where the transport is the
 * kernel on the same CPUs, 1 MiB SENDs (each longer than the spin there) went at 0.8x
 * the rate of a receiver that busy-polls. */
int64_t fp_receive(fp_ep *ep, int64_t iters, int64_t step_ns, int64_t *elapsed_ns)
{
    int64_t got = 0, t0 = now_ns(), deadline = t0 + step_ns;
    int sleeps = ep->sleeps;
    *elapsed_ns = 0;
    if (loop_ready(ep, 1))
        return 0;
    ep->sleeps = 1;
    while (got < iters) {
        int r = wait_recv(ep, deadline, NULL);
        if (r <= 0)
            break;
        got++;
        deadline = now_ns() + step_ns; /* clock read per message: fine beside a receive */
    }
    ep->sleeps = sleeps;
    *elapsed_ns = now_ns() - t0;
    return got;
}

/* ------------------------------------------------------------------ UD probing */

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = v >> 24, p[1] = v >> 16, p[2] = v >> 8, p[3] = v;
}

static uint32_t get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int ud_post_recv(fp_ep *ep, uint32_t slot)
{
    struct ibv_sge sge = {(uintptr_t)(ep->buf + (size_t)slot * UD_SLOT), UD_SLOT, ep->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = 1}, *bad;
    int rc = ibv_post_recv(ep->qp, &wr, &bad);
    return rc ? fail(ep, rc, "UD QP %u: ibv_post_recv", ep->qp->qp_num) : 0;
}

/* Open DEVICE with a UD QP in RTS (QKEY), DEPTH receive slots posted and one send slot.
 * GID_INDEX < 0 picks the first IPv4 RoCE v2 GID. On failure everything is released. */
int fp_ud_open(fp_ep *ep, const char *device, uint32_t depth, uint32_t port, int gid_index,
               uint32_t qkey, uint32_t psn)
{
    int rc;
    long page = sysconf(_SC_PAGESIZE);
    size_t bytes = (size_t)(depth + 1) * UD_SLOT;

    clear_error(ep);
    if (ep->ctx)
        return fail(ep, EBUSY, "%s: endpoint already open", device);
    if (depth < 2)
        return fail(ep, EINVAL, "%s: depth %u too small", device, depth);
    ep->size = UD_MSG, ep->depth = depth, ep->port = port, ep->qkey = qkey;
    ep->psn = psn & 0xffffff;
    if (open_common(ep, device, port, gid_index, 2 * (int)depth))
        goto out;
    struct ibv_device_attr_ex dattr;
    ep->hw_ts = !ibv_query_device_ex(ep->ctx, NULL, &dattr) && dattr.completion_timestamp_mask;
    if ((rc = posix_memalign((void **)&ep->buf, page, bytes))) {
        fail(ep, rc, "%s: allocating %zu bytes", device, bytes);
        goto out;
    }
    memset(ep->buf, 0, bytes);
    if (!(ep->mr = ibv_reg_mr(ep->pd, ep->buf, bytes, IBV_ACCESS_LOCAL_WRITE))) {
        fail(ep, errno, "%s: ibv_reg_mr of %zu bytes", device, bytes);
        goto out;
    }
    struct ibv_qp_init_attr init = {
        .send_cq = ep->send_cq,
        .recv_cq = ep->recv_cq,
        .cap = {.max_send_wr = depth, .max_recv_wr = depth, .max_send_sge = 1,
                .max_recv_sge = 1},
        .qp_type = IBV_QPT_UD,
    };
    if (!(ep->qp = ibv_create_qp(ep->pd, &init))) {
        fail(ep, errno, "%s: ibv_create_qp (UD)", device);
        goto out;
    }
    struct ibv_qp_attr attr = {
        .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = port, .qkey = qkey,
    };
    if ((rc = ibv_modify_qp(ep->qp, &attr,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))) {
        fail(ep, rc, "%s: UD QP %u to INIT", device, ep->qp->qp_num);
        goto out;
    }
    attr.qp_state = IBV_QPS_RTR;
    if ((rc = ibv_modify_qp(ep->qp, &attr, IBV_QP_STATE))) {
        fail(ep, rc, "%s: UD QP %u to RTR", device, ep->qp->qp_num);
        goto out;
    }
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn = ep->psn;
    if ((rc = ibv_modify_qp(ep->qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN))) {
        fail(ep, rc, "%s: UD QP %u to RTS", device, ep->qp->qp_num);
        goto out;
    }
    for (uint32_t i = 0; i < depth; i++)
        if (ud_post_recv(ep, i))
            goto out;
    return 0;
out:
    fp_close(ep);
    return -1;
}

int fp_ud_hw_ts(const fp_ep *ep) { return ep->hw_ts; }

/* The address handle towards the peer's UD QP (QPN at GID); replaces an earlier one. */
int fp_ud_remote(fp_ep *ep, uint32_t qpn, const uint8_t *gid)
{
    clear_error(ep);
    if (!ep->qp)
        return fail(ep, EBADF, "endpoint is closed");
    struct ibv_ah_attr attr = {.is_global = 1, .port_num = ep->port,
                               .grh = {.sgid_index = ep->gid_index, .hop_limit = 64}};
    memcpy(attr.grh.dgid.raw, gid, 16);
    struct ibv_ah *ah = ibv_create_ah(ep->pd, &attr);
    if (!ah)
        return fail(ep, errno, "UD QP %u: ibv_create_ah", ep->qp->qp_num);
    if (ep->ah)
        ibv_destroy_ah(ep->ah);
    ep->ah = ah, ep->remote_qpn = qpn, ep->connected = 1;
    return 0;
}

/* Send one message; its timestamp is taken just before the post (a completion seen by a
 * busy poller can come after the reply). 0, or -1 on a failed post or a full send queue. */
static int ud_send(fp_ep *ep, uint32_t kind, uint32_t seq, uint64_t value, int64_t deadline,
                   int64_t *t)
{
    uint8_t *m = ep->buf + (size_t)ep->depth * UD_SLOT;
    if (wait_send(ep, (int)ep->depth - 1, deadline) <= 0)
        return -1;
    put_be32(m, UD_MAGIC), put_be32(m + 4, kind), put_be32(m + 8, seq);
    put_be32(m + 12, (uint32_t)(value >> 32)), put_be32(m + 16, (uint32_t)value);
    struct ibv_sge sge = {(uintptr_t)m, UD_MSG, ep->mr->lkey};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                             .wr.ud = {.ah = ep->ah, .remote_qpn = ep->remote_qpn,
                                       .remote_qkey = ep->qkey}};
    *t = now_ns();
    return post_send(ep, &wr, 1);
}

/* The next valid message before DEADLINE: 1 (KIND, SEQ, VALUE, T set), 0 at the deadline
 * or on stop, -1 on an error. Malformed datagrams are dropped, their slot re-posted.
 * EMPTY_AT (the prober's; NULL for the responder) gets the clock read just before each
 * poll that found the receive CQ empty: a message found later arrived after it, so the
 * time from it to T bounds how late this loop saw the message. The cost is one vDSO
 * clock_gettime per empty poll, beside the poll's own: fp_clock_overhead_ns measured a
 * pair of reads at 30 ns on an x86 host with a TSC clocksource and 90-160 ns in the
 * lane's emulation. It carries over from one call to the next. */
static int ud_receive(fp_ep *ep, int64_t deadline, uint32_t *kind, uint32_t *seq,
                      uint64_t *value, int64_t *t, int64_t *empty_at)
{
    struct ibv_wc wc;
    struct spin s = {.cq = ep->recv_cq};
    for (;;) {
        int64_t before = empty_at ? now_ns() : 0;
        int n = ibv_poll_cq(ep->recv_cq, 1, &wc);
        if (n == 0 && empty_at)
            *empty_at = before;
        if (n > 0) {
            int64_t at = now_ns();
            uint32_t slot = (uint32_t)wc.wr_id;
            const uint8_t *m = ep->buf + (size_t)slot * UD_SLOT + UD_GRH;
            int ok = wc.status == IBV_WC_SUCCESS && wc.byte_len == UD_SLOT &&
                     get_be32(m) == UD_MAGIC;
            if (ok) {
                *kind = get_be32(m + 4), *seq = get_be32(m + 8);
                *value = (uint64_t)get_be32(m + 12) << 32 | get_be32(m + 16);
                *t = at;
            }
            if (wc.status == IBV_WC_WR_FLUSH_ERR)
                return wc_fail(ep, &wc, "receive");
            if (ud_post_recv(ep, slot))
                return -1;
            if (ok)
                return 1;
            continue;
        }
        if (n < 0)
            return fail(ep, EIO, "UD QP %u: polling the receive CQ", ep->qp->qp_num);
        int r = spin_on(ep, &s, deadline);
        if (r < 0)
            return 0;
        if (s.woke && empty_at)
            *empty_at = s.last; /* a sleep's wake-up stands for an empty poll */
        s.woke = 0;
        if (r && reap_send(ep) < 0)
            return -1;
    }
}

/* An ACK for probe SEQ of the round that began at SEQ0, of which SENT are out: while a probe
 * waits, RAW holds its ACK1's arrival and DELAY its ACK2's value (-1 until they come).
 * NET holds the probe's send time t1; an ACK1 seen at T after the last empty poll at
 * EMPTY_AT puts T - max(EMPTY_AT, t1) in PROBER: how late the prober can have seen it.
 * Returns 1 when this ACK completes the probe's answer. Anything outside the round (a
 * late ACK of an earlier round, a repeat) is ignored. */
static int ud_take(uint32_t seq0, int64_t sent, uint32_t kind, uint32_t seq, uint64_t value,
                   int64_t t, int64_t empty_at, const int64_t *net, int64_t *raw,
                   int64_t *delay, int64_t *prober)
{
    uint32_t i = seq - seq0;
    if ((int64_t)i >= sent)
        return 0;
    int was = raw[i] >= 0 && delay[i] >= 0;
    if (kind == UD_ACK1 && raw[i] < 0) {
        raw[i] = t;
        prober[i] = t - (empty_at > net[i] ? empty_at : net[i]);
    } else if (kind == UD_ACK2 && delay[i] < 0)
        delay[i] = (int64_t)(value & INT64_MAX);
    return !was && raw[i] >= 0 && delay[i] >= 0;
}

/* The prober: COUNT probes with sequence numbers SEQ0, SEQ0 + 1, ..., one out at a time.
 * Each waits up to STEP_NS for its two ACKs, then the next goes, no sooner than
 * INTERVAL_NS after the one before. ACKs that come after their probe's step are still
 * taken while later probes wait, and for LATE_NS after the last probe went out: a late
 * answer is delay, not loss. For probe i, NET[i] gets the network RTT (t4 - t1 minus the
 * responder's delay), RAW[i] t4 - t1, DELAY[i] the responder's delay, PROBER[i] how late
 * this loop can have seen ACK1 (t4 minus the clock read before the last empty poll of
 * the receive CQ, or t1 when there was none since: the pauses of a long wait and any
 * time the thread was descheduled are in it), all -1 when no answer came in time. Until
 * then NET[i] holds the probe's send time t1. The send side is not timed: the loop
 * reaps send completions lazily, so that nothing stands between the post and the first
 * poll for the answer. Returns the probes sent (fewer only on stop or an error, kept in
 * the endpoint). */
int64_t fp_ud_probe(fp_ep *ep, int64_t count, int64_t step_ns, int64_t interval_ns,
                    int64_t late_ns, uint32_t seq0, int64_t *net, int64_t *raw, int64_t *delay,
                    int64_t *prober)
{
    if (loop_ready(ep, UD_MSG))
        return 0;
    int64_t sent = 0, answered = 0, t, empty_at = 0;
    uint32_t kind, mseq;
    uint64_t value;
    int failed = 0;
    for (int64_t i = 0; i < count; i++)
        net[i] = raw[i] = delay[i] = prober[i] = -1;
    for (int64_t i = 0; i < count && !failed; i++) {
        int64_t t1, deadline = now_ns() + step_ns;
        if (stopped(ep) || ud_send(ep, UD_PROBE, seq0 + (uint32_t)i, 0, deadline, &t1))
            break;
        net[i] = t1, sent = i + 1;
        /* this probe's answer until its step ends, then the pause to the next (none after
         * the last: the wait for late answers below takes over); late ACKs of earlier
         * probes are taken on the way */
        int64_t next = i + 1 < count ? t1 + interval_ns : t1;
        while (!stopped(ep)) {
            int64_t until = raw[i] >= 0 && delay[i] >= 0 ? next : deadline > next ? deadline : next;
            if (now_ns() >= until)
                break;
            int r = ud_receive(ep, until, &kind, &mseq, &value, &t, &empty_at);
            if (r < 0) {
                failed = 1;
                break;
            }
            if (r > 0)
                answered += ud_take(seq0, sent, kind, mseq, value, t, empty_at, net, raw,
                                    delay, prober);
        }
    }
    /* answers still on their way: wait for them up to LATE_NS after the last probe */
    if (sent && !failed) {
        int64_t until = net[sent - 1] + (late_ns > step_ns ? late_ns : step_ns);
        while (answered < sent) {
            int r = ud_receive(ep, until, &kind, &mseq, &value, &t, &empty_at);
            if (r <= 0)
                break;
            answered += ud_take(seq0, sent, kind, mseq, value, t, empty_at, net, raw, delay,
                                prober);
        }
    }
    wait_send(ep, 0, now_ns() + step_ns); /* the last probe completes (an error is kept) */
    for (int64_t i = 0; i < sent; i++) {
        int64_t t1 = net[i];
        if (raw[i] >= 0 && delay[i] >= 0 && delay[i] <= raw[i] - t1) {
            raw[i] -= t1;
            net[i] = raw[i] - delay[i];
        } else {
            net[i] = raw[i] = delay[i] = prober[i] = -1;
        }
    }
    return sent;
}

/* The responder: answer up to COUNT probes, each with ACK1 and then ACK2 carrying its own
 * delay (t3 - t2: from seeing the probe to posting ACK1). Ends early when no probe comes
 * within IDLE_NS, on stop, or on an error (kept). Returns the probes answered. */
int64_t fp_ud_answer(fp_ep *ep, int64_t count, int64_t step_ns, int64_t idle_ns)
{
    int64_t answered = 0;
    if (loop_ready(ep, UD_MSG))
        return 0;
    int64_t idle = now_ns() + idle_ns;
    while (answered < count) {
        uint32_t kind, seq;
        uint64_t value;
        int64_t t2, t3, t;
        int r = ud_receive(ep, idle, &kind, &seq, &value, &t2, NULL);
        if (r <= 0)
            break;
        if (kind != UD_PROBE)
            continue;
        int64_t deadline = now_ns() + step_ns;
        if (ud_send(ep, UD_ACK1, seq, 0, deadline, &t3) ||
            ud_send(ep, UD_ACK2, seq, (uint64_t)(t3 - t2), deadline, &t))
            break;
        answered++;
        idle = now_ns() + idle_ns;
    }
    wait_send(ep, 0, now_ns() + step_ns); /* the last ACKs complete (an error is kept) */
    return answered;
}
