/*
 * floor-proxy: a Redis sharding proxy with almost no code of its own, to
 * measure what forwarding alone costs on a machine: scripts/bench-cpu
 * --floor (issue 31). Not a proven lower bound: a proxy can spend less in
 * the kernel than this one does (chash does, in some sittings).
 *
 * Not a product and not a part of chash: a measuring stick. It does only what
 * any proxy must do and nothing else: one thread, level-triggered epoll, one
 * connection per server; reads each client's requests (RESP2 arrays), hashes
 * the first key (FNV-1a 64, modulo the servers), appends the request as it
 * came to its server's buffer, splits an MGET over several servers into one
 * MGET each and merges their replies in the client's key order, and sends each
 * client its replies in request order. Writes are deferred to the end of each
 * epoll wake, so a server gets one write for all the clients' requests of
 * that wake and a client one for all its replies (one read and one write
 * per unpipelined client request, as chash). No timeouts, no limits, no stats, no config, no failover, no
 * error handling beyond closing a client that sends something else.
 *
 * Build: cc -O2 -o floor-proxy scripts/floor-proxy.c
 *        cc -O2 -DURING -o floor-proxy-uring scripts/floor-proxy.c   (io_uring:
 *        each wake's reads in one io_uring_enter, its writes in another)
 *        cc -O2 -DURING_SENDS -o floor-proxy-sends scripts/floor-proxy.c
 *        (io_uring for the writes only: reads one read() per socket)
 * Run:   floor-proxy LISTEN_PORT SERVER_PORT...   (all on 127.0.0.1)
 */
#define _GNU_SOURCE
#if defined(URING_SENDS) && !defined(URING)
#define URING
#endif
/* Reads through io_uring too (-DURING), or one read() per socket. */
#if defined(URING) && !defined(URING_SENDS)
#define URING_READS
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#ifdef URING
#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#endif

#define MAX_SERVERS 16
#define MAX_KEYS 1024
#define READ_CHUNK 65536

typedef struct {
    char *p;
    size_t start, end, cap;
} buf_t;

static void reserve(buf_t *b, size_t extra) {
    if (b->start > 0 && b->end + extra > b->cap) {
        memmove(b->p, b->p + b->start, b->end - b->start);
        b->end -= b->start;
        b->start = 0;
    }
    if (b->end + extra > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->end + extra) c *= 2;
        b->p = realloc(b->p, c);
        if (!b->p) abort();
        b->cap = c;
    }
}

static void append(buf_t *b, const char *s, size_t n) {
    reserve(b, n);
    memcpy(b->p + b->end, s, n);
    b->end += n;
}

/* A length line, `*12\r\n`; n >= 0. */
static void append_len(buf_t *b, char type, long n) {
    char line[32];
    int k = sizeof line;
    line[--k] = '\n';
    line[--k] = '\r';
    do {
        line[--k] = (char)('0' + n % 10);
        n /= 10;
    } while (n > 0);
    line[--k] = type;
    append(b, line + k, sizeof line - (size_t)k);
}

enum kind { LISTENER, CLIENT, SERVER };

struct req;

typedef struct client {
    enum kind kind;
    int fd, closed, dirty, outstanding, watching_out;
    buf_t in, out;
    struct req *head, *tail; /* requests waiting for their replies, in order */
    struct client *next_dirty;
} client_t;

/* Kept on a free list when answered, their buffers with them: no
 * allocation per request once the first ones are made. */
typedef struct req {
    struct req *next;
    client_t *c;
    int pending;     /* fragments still to come */
    int done;        /* its reply is in `reply` */
    int nkeys;       /* split MGET: keys, in the client's order; 0 if not split */
    buf_t reply;     /* a reply that came before the requests ahead of it */
    buf_t frags[MAX_SERVERS];    /* split MGET: each server's reply */
    uint8_t key_frag[MAX_KEYS];  /* split MGET: which fragment has key i */
    uint16_t key_item[MAX_KEYS]; /* and its position there */
} req_t;

static req_t *free_reqs;

typedef struct {
    req_t *r;
    int frag;
} slot_t;

typedef struct server {
    enum kind kind;
    int fd, dirty, watching_out;
    buf_t in, out;
    slot_t *q; /* a ring of the requests sent, in order */
    size_t qhead, qlen, qcap;
    struct server *next_dirty;
} server_t;

static server_t servers[MAX_SERVERS];
static int nservers;
static int ep;
static client_t *dirty_clients;
static server_t *dirty_servers;

static uint64_t fnv1a64(const char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static void push_slot(server_t *s, req_t *r, int frag) {
    if (s->qlen == s->qcap) {
        size_t cap = s->qcap ? s->qcap * 2 : 1024;
        slot_t *q = malloc(cap * sizeof *q);
        for (size_t i = 0; i < s->qlen; i++) q[i] = s->q[(s->qhead + i) % s->qcap];
        free(s->q);
        s->q = q;
        s->qhead = 0;
        s->qcap = cap;
    }
    s->q[(s->qhead + s->qlen) % s->qcap] = (slot_t){r, frag};
    s->qlen++;
}

static void mark_server(server_t *s) {
    if (!s->dirty) {
        s->dirty = 1;
        s->next_dirty = dirty_servers;
        dirty_servers = s;
    }
}

static void mark_client(client_t *c) {
    if (!c->dirty) {
        c->dirty = 1;
        c->next_dirty = dirty_clients;
        dirty_clients = c;
    }
}

/* A number ended by CRLF at p[at..]: its value and where the line ends (the
 * CR), or -1 when the line is not all here. */
static long line_number(const char *p, size_t len, size_t at, long *value) {
    long v = 0, sign = 1;
    size_t i = at;
    if (i < len && p[i] == '-') {
        sign = -1;
        i++;
    }
    for (; i < len && p[i] != '\r'; i++) v = v * 10 + (p[i] - '0');
    if (i + 1 >= len) return -1;
    *value = v * sign;
    return (long)i;
}

/* The end of the reply at p[at..], or -1 when it is not all here. */
static long reply_end(const char *p, size_t len, size_t at) {
    if (at >= len) return -1;
    char t = p[at];
    long v;
    long cr;
    if (t == '+' || t == '-' || t == ':') {
        const char *nl = memchr(p + at, '\n', len - at);
        return nl ? (long)(nl - p) + 1 : -1;
    }
    cr = line_number(p, len, at + 1, &v);
    if (cr < 0) return -1;
    size_t next = (size_t)cr + 2;
    if (t == '$') {
        if (v < 0) return (long)next;
        return next + (size_t)v + 2 <= len ? (long)(next + (size_t)v + 2) : -1;
    }
    if (t == '*') {
        for (long i = 0; i < v; i++) {
            long e = reply_end(p, len, next);
            if (e < 0) return -1;
            next = (size_t)e;
        }
        return (long)next;
    }
    return -2;
}

static void free_req(req_t *r) {
    r->reply.start = r->reply.end = 0;
    for (int i = 0; i < nservers; i++) r->frags[i].start = r->frags[i].end = 0;
    r->next = free_reqs;
    free_reqs = r;
}

static void maybe_free_client(client_t *c) {
    /* Not while on the list of clients to write to: freed from there. */
    if (c->closed && c->outstanding == 0 && !c->dirty) {
        free(c->in.p);
        free(c->out.p);
        free(c);
    }
}

/* The client's first request, answered: off its queue, `n` bytes of its
 * reply at `p` to the client's output (dropped if it has gone). */
static void answer_head(client_t *c, const char *p, size_t n) {
    req_t *r = c->head;
    c->head = r->next;
    if (!c->head) c->tail = NULL;
    if (!c->closed) {
        append(&c->out, p, n);
        mark_client(c);
    }
    c->outstanding--;
    free_req(r);
}

/* Sends the client the replies at the head of its queue that are done. */
static void drain(client_t *c) {
    while (c->head && c->head->done) answer_head(c, c->head->reply.p + c->head->reply.start,
                                                 c->head->reply.end - c->head->reply.start);
    maybe_free_client(c);
}

/* A fragment's reply, p[0..n], for request r. */
static void deliver(req_t *r, int frag, const char *p, size_t n) {
    client_t *c = r->c;
    if (!r->nkeys) {
        if (c->head == r) {
            /* The common case: straight into the client's output. */
            answer_head(c, p, n);
            drain(c);
            return;
        }
        append(&r->reply, p, n);
        r->done = 1;
        drain(c);
        return;
    }
    append(&r->frags[frag], p, n);
    if (--r->pending > 0) return;
    /* Every server has answered: the items in the client's key order. */
    static size_t offs[MAX_SERVERS][MAX_KEYS + 1];
    for (int f = 0; f < nservers; f++) {
        buf_t *b = &r->frags[f];
        if (b->end == 0) continue;
        long count;
        long cr = line_number(b->p, b->end, 1, &count);
        if (b->p[0] != '*' || count < 0) {
            /* An error instead of an array: that is the reply. */
            append(&r->reply, b->p, b->end);
            goto done;
        }
        size_t at = (size_t)cr + 2;
        for (long i = 0; i < count; i++) {
            offs[f][i] = at;
            at = (size_t)reply_end(b->p, b->end, at);
        }
        offs[f][count] = at;
    }
    append_len(&r->reply, '*', r->nkeys);
    for (int k = 0; k < r->nkeys; k++) {
        int f = r->key_frag[k], i = r->key_item[k];
        append(&r->reply, r->frags[f].p + offs[f][i], offs[f][i + 1] - offs[f][i]);
    }
done:
    r->done = 1;
    drain(c);
}

static req_t *new_req(client_t *c) {
    req_t *r = free_reqs;
    if (r) {
        free_reqs = r->next;
    } else {
        r = calloc(1, sizeof *r);
        if (!r) abort();
    }
    r->next = NULL;
    r->pending = r->done = r->nkeys = 0;
    r->c = c;
    if (c->tail)
        c->tail->next = r;
    else
        c->head = r;
    c->tail = r;
    c->outstanding++;
    return r;
}

/* Parses and routes the client's complete requests; 0 when it sent something
 * this proxy does not take. */
static int handle_requests(client_t *c) {
    static size_t arg_at[MAX_KEYS + 2], arg_len[MAX_KEYS + 2], arg_frame[MAX_KEYS + 2];
    buf_t *b = &c->in;
    while (b->start < b->end) {
        const char *p = b->p;
        size_t len = b->end, at = b->start;
        if (p[at] != '*') return 0;
        long n;
        long cr = line_number(p, len, at + 1, &n);
        if (cr < 0) return 1;
        if (n < 1 || n > MAX_KEYS + 1) return 0;
        size_t pos = (size_t)cr + 2;
        int complete = 1;
        for (long i = 0; i < n; i++) {
            long l;
            if (pos >= len) { complete = 0; break; }
            if (p[pos] != '$') return 0;
            arg_frame[i] = pos;
            long lcr = line_number(p, len, pos + 1, &l);
            if (lcr < 0) { complete = 0; break; }
            arg_at[i] = (size_t)lcr + 2;
            if (l < 0) return 0;
            arg_len[i] = (size_t)l;
            pos = arg_at[i] + (size_t)l + 2;
            if (pos > len) { complete = 0; break; }
        }
        if (!complete) return 1;
        arg_frame[n] = pos;
        req_t *r = new_req(c);
        int first = n >= 2 ? (int)(fnv1a64(p + arg_at[1], arg_len[1]) % (uint64_t)nservers) : 0;
        int split = 0;
        if (n > 2 && arg_len[0] == 4 && strncasecmp(p + arg_at[0], "MGET", 4) == 0) {
            /* Each key hashed once: its server kept for the split. */
            r->key_frag[0] = (uint8_t)first;
            for (long i = 2; i < n; i++) {
                r->key_frag[i - 1] = (uint8_t)(fnv1a64(p + arg_at[i], arg_len[i]) % (uint64_t)nservers);
                split |= r->key_frag[i - 1] != first;
            }
        }
        if (!split) {
            server_t *s = &servers[first];
            r->pending = 1;
            append(&s->out, p + at, pos - at);
            push_slot(s, r, 0);
            mark_server(s);
        } else {
            int keys[MAX_SERVERS] = {0};
            r->nkeys = (int)n - 1;
            for (long i = 1; i < n; i++) r->key_item[i - 1] = (uint16_t)keys[r->key_frag[i - 1]]++;
            for (int f = 0; f < nservers; f++) {
                if (!keys[f]) continue;
                server_t *s = &servers[f];
                append_len(&s->out, '*', keys[f] + 1);
                append(&s->out, "$4\r\nMGET\r\n", 10);
                for (long i = 1; i < n; i++)
                    if (r->key_frag[i - 1] == f) append(&s->out, p + arg_frame[i], arg_frame[i + 1] - arg_frame[i]);
                push_slot(s, r, f);
                r->pending++;
                mark_server(s);
            }
        }
        b->start = pos;
    }
    b->start = b->end = 0;
    return 1;
}

static void close_client(client_t *c) {
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->closed = 1;
    c->in.start = c->in.end = 0;
    maybe_free_client(c); /* not while on the dirty list: freed after the flush */
}

#ifndef URING_READS
/* Reads what a socket has into b's free room: the bytes read, or -errno. */
static ssize_t read_into(int fd, buf_t *b) {
    reserve(b, READ_CHUNK);
    ssize_t n = read(fd, b->p + b->end, b->cap - b->end);
    return n < 0 ? -errno : n;
}
#endif

/* What a client's read returned: n bytes, or -errno. */
static void client_read(client_t *c, ssize_t n) {
    if (n == 0 || (n < 0 && n != -EAGAIN && n != -EINTR)) {
        close_client(c);
        return;
    }
    if (n < 0) return;
    c->in.end += (size_t)n;
    if (!handle_requests(c)) close_client(c);
}

/* What a server's read returned: n bytes, or -errno. */
static void server_read(server_t *s, ssize_t n) {
    if (n <= 0) {
        if (n == -EAGAIN || n == -EINTR) return;
        fprintf(stderr, "floor-proxy: a server closed\n");
        exit(1);
    }
    s->in.end += (size_t)n;
    for (;;) {
        long e = reply_end(s->in.p, s->in.end, s->in.start);
        if (e == -2) {
            fprintf(stderr, "floor-proxy: a reply it cannot read\n");
            exit(1);
        }
        if (e < 0) break;
        if (s->qlen == 0) {
            fprintf(stderr, "floor-proxy: a reply no request asked for\n");
            exit(1);
        }
        slot_t slot = s->q[s->qhead];
        s->qhead = (s->qhead + 1) % s->qcap;
        s->qlen--;
        deliver(slot.r, slot.frag, s->in.p + s->in.start, (size_t)e - s->in.start);
        s->in.start = (size_t)e;
    }
    if (s->in.start == s->in.end) s->in.start = s->in.end = 0;
}

/* Writes what it can; the rest waits for the socket to take more. */
static int flush(int fd, buf_t *b, int *want_out) {
    while (b->start < b->end) {
        ssize_t n = write(fd, b->p + b->start, b->end - b->start);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) break;
            return -1;
        }
        b->start += (size_t)n;
    }
    int rest = b->start < b->end;
    if (!rest) b->start = b->end = 0;
    *want_out = rest;
    return 0;
}


#ifdef URING
/* With -DURING: the same forwarder, but a wake's reads go to the kernel in
 * one io_uring_enter and its writes in another, instead of one read or
 * write call per socket. epoll still says which sockets are ready. This
 * asks what a proxy gains on this machine by batching its socket calls
 * across sockets. With -DURING_SENDS only the writes are batched, the
 * reads staying one read() per socket: the part a proxy on epoll readiness
 * (twemproxy, chash on tokio) could batch too, at the end of a wake. */
#define RING_ENTRIES 1024
static int ring_fd;
static unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
static unsigned local_tail, queued;
static struct io_uring_sqe *sqes;
static struct io_uring_cqe *cqes;

static void ring_init(void) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    ring_fd = (int)syscall(__NR_io_uring_setup, RING_ENTRIES, &p);
    if (ring_fd < 0) {
        perror("floor-proxy: io_uring_setup");
        exit(1);
    }
    size_t sq_size = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cq_size = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (!(p.features & IORING_FEAT_SINGLE_MMAP)) {
        fprintf(stderr, "floor-proxy: io_uring without a single mmap\n");
        exit(1);
    }
    size_t size = sq_size > cq_size ? sq_size : cq_size;
    char *ring = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring_fd, IORING_OFF_SQ_RING);
    sqes = mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                MAP_SHARED | MAP_POPULATE, ring_fd, IORING_OFF_SQES);
    if (ring == MAP_FAILED || sqes == MAP_FAILED) {
        perror("floor-proxy: mmap");
        exit(1);
    }
    sq_tail = (unsigned *)(ring + p.sq_off.tail);
    sq_mask = (unsigned *)(ring + p.sq_off.ring_mask);
    sq_array = (unsigned *)(ring + p.sq_off.array);
    cq_head = (unsigned *)(ring + p.cq_off.head);
    cq_tail = (unsigned *)(ring + p.cq_off.tail);
    cq_mask = (unsigned *)(ring + p.cq_off.ring_mask);
    cqes = (struct io_uring_cqe *)(ring + p.cq_off.cqes);
    local_tail = *sq_tail;
}

/* Queues a recv or send of len bytes at `at` on fd, tagged for its completion. */
static void queue_io(int op, int fd, char *at, size_t len, uint64_t tag) {
    unsigned i = local_tail & *sq_mask;
    struct io_uring_sqe *e = &sqes[i];
    memset(e, 0, sizeof *e);
    e->opcode = (uint8_t)op;
    e->fd = fd;
    e->addr = (uint64_t)(uintptr_t)at;
    e->len = (uint32_t)len;
    e->user_data = tag;
    /* Never wait: io_uring would otherwise wait for a socket that is not
     * ready, whatever its O_NONBLOCK says, and stall the whole loop. */
    e->msg_flags = MSG_DONTWAIT;
    sq_array[i] = i;
    local_tail++;
    queued++;
}

#ifdef URING_READS
/* Queues a read of what the socket has into b's free room; tagged `who`. */
static void queue_recv(int fd, buf_t *b, void *who) {
    reserve(b, READ_CHUNK);
    queue_io(IORING_OP_RECV, fd, b->p + b->end, b->cap - b->end, (uintptr_t)who);
}
#endif

/* Submits what is queued and waits for all of it (the sockets are
 * non-blocking: each completes at once); results[k] for the k-th queued. */
static void run_queued(long *results, uint64_t *tags) {
    unsigned n = queued;
    queued = 0;
    if (!n) return;
    __atomic_store_n(sq_tail, local_tail, __ATOMIC_RELEASE);
    unsigned got = 0;
    unsigned submit = n;
    while (got < n) {
        long r = syscall(__NR_io_uring_enter, ring_fd, submit, n - got, IORING_ENTER_GETEVENTS, NULL, 0);
        if (r < 0 && errno != EINTR) {
            perror("floor-proxy: io_uring_enter");
            exit(1);
        }
        if (r > 0) submit -= (unsigned)r > submit ? submit : (unsigned)r;
        unsigned head = *cq_head, tail = __atomic_load_n(cq_tail, __ATOMIC_ACQUIRE);
        for (; head != tail; head++) {
            struct io_uring_cqe *c = &cqes[head & *cq_mask];
            results[got] = c->res;
            tags[got] = c->user_data;
            got++;
        }
        __atomic_store_n(cq_head, head, __ATOMIC_RELEASE);
    }
}

static long results[RING_ENTRIES];
static uint64_t tags[RING_ENTRIES];

/* Runs the sends queued: each takes what it sent off its buffer; what is
 * left (or an error) goes to flush(), which writes the rest with write()
 * or closes the socket. */
static void run_sends(void) {
    unsigned n = queued;
    run_queued(results, tags);
    for (unsigned j = 0; j < n; j++) {
        enum kind *k = (enum kind *)(uintptr_t)tags[j];
        buf_t *b = *k == CLIENT ? &((client_t *)k)->out : &((server_t *)k)->out;
        if (results[j] > 0) b->start += (size_t)results[j];
    }
}

/* Queues a send of b's unsent bytes, if any; the ring's worth at a time. */
static void queue_send(int fd, buf_t *b, void *who) {
    if (b->start == b->end) return;
    if (queued == RING_ENTRIES) run_sends();
    queue_io(IORING_OP_SEND, fd, b->p + b->start, b->end - b->start, (uintptr_t)who);
}
#endif

static void watch(int fd, void *who, int out, int op) {
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.ptr = who};
    epoll_ctl(ep, op, fd, &ev);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: floor-proxy LISTEN_PORT SERVER_PORT...\n");
        return 2;
    }
#ifdef URING
    ring_init();
#endif
    signal(SIGPIPE, SIG_IGN);
    /* Stopped by SIGINT (callgrind-proxy-redis) even when started from a
     * background job, which inherits SIGINT ignored. */
    signal(SIGINT, SIG_DFL);
    ep = epoll_create1(0);
    int one = 1;
    nservers = argc - 2;
    if (nservers > MAX_SERVERS) return 2;
    for (int i = 0; i < nservers; i++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[i + 2]))};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
            perror("floor-proxy: connect");
            return 1;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fcntl(fd, F_SETFL, O_NONBLOCK);
        servers[i].kind = SERVER;
        servers[i].fd = fd;
        watch(fd, &servers[i], 0, EPOLL_CTL_ADD);
    }
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in la = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    la.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&la, sizeof la) < 0 || listen(lfd, 1024) < 0) {
        perror("floor-proxy: listen");
        return 1;
    }
    static enum kind listener = LISTENER;
    watch(lfd, &listener, 0, EPOLL_CTL_ADD);
    struct epoll_event evs[256];
    for (;;) {
        /* Before sleeping, the CPU is offered to the processes this wake's
         * writes woke (as chash's workers do before they park): they run
         * now rather than preempting this process later, and their answers
         * are often in by the time it looks. */
        sched_yield();
        int n = epoll_wait(ep, evs, 256, -1);
        if (n < 0 && errno == EINTR) continue;
        for (int i = 0; i < n; i++) {
            enum kind k = *(enum kind *)evs[i].data.ptr;
            if (k == LISTENER) {
                int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
                if (fd < 0) continue;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                client_t *c = calloc(1, sizeof *c);
                c->kind = CLIENT;
                c->fd = fd;
                watch(fd, c, 0, EPOLL_CTL_ADD);
            } else if (k == CLIENT) {
                client_t *c = evs[i].data.ptr;
                if (evs[i].events & EPOLLOUT) mark_client(c);
                if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
#ifdef URING_READS
                    queue_recv(c->fd, &c->in, c);
#else
                    client_read(c, read_into(c->fd, &c->in));
#endif
                }
            } else {
                server_t *s = evs[i].data.ptr;
                if (evs[i].events & EPOLLOUT) mark_server(s);
                if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
#ifdef URING_READS
                    queue_recv(s->fd, &s->in, s);
#else
                    server_read(s, read_into(s->fd, &s->in));
#endif
                }
            }
        }
#ifdef URING
        /* The wake's reads, all in one call (epoll gives at most 256 of
         * them: they fit the ring; none with -DURING_SENDS, whose reads
         * were made above); then the writes, in another. */
        unsigned reads = queued;
        run_queued(results, tags);
        for (unsigned j = 0; j < reads; j++) {
            enum kind *k = (enum kind *)(uintptr_t)tags[j];
            if (*k == CLIENT)
                client_read((client_t *)k, results[j]);
            else
                server_read((server_t *)k, results[j]);
        }
        for (server_t *s = dirty_servers; s; s = s->next_dirty)
            queue_send(s->fd, &s->out, s);
        for (client_t *c = dirty_clients; c; c = c->next_dirty)
            if (!c->closed) queue_send(c->fd, &c->out, c);
        run_sends();
#endif
        /* The wake's writes: one per server, one per client. */
        while (dirty_servers) {
            server_t *s = dirty_servers;
            dirty_servers = s->next_dirty;
            s->dirty = 0;
            int out;
            if (flush(s->fd, &s->out, &out) < 0) {
                fprintf(stderr, "floor-proxy: a server closed\n");
                return 1;
            }
            if (out != s->watching_out) {
                s->watching_out = out;
                watch(s->fd, s, out, EPOLL_CTL_MOD);
            }
        }
        while (dirty_clients) {
            client_t *c = dirty_clients;
            dirty_clients = c->next_dirty;
            c->dirty = 0;
            if (c->closed) {
                maybe_free_client(c);
                continue;
            }
            int out = 0;
            if (flush(c->fd, &c->out, &out) < 0) {
                close_client(c);
                continue;
            }
            if (out != c->watching_out) {
                c->watching_out = out;
                watch(c->fd, c, out, EPOLL_CTL_MOD);
            }
        }
    }
}
