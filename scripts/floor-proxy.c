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
 * Run:   floor-proxy LISTEN_PORT SERVER_PORT...   (all on 127.0.0.1)
 */
#define _GNU_SOURCE
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

static void on_client(client_t *c) {
    reserve(&c->in, READ_CHUNK);
    ssize_t n = read(c->fd, c->in.p + c->in.end, c->in.cap - c->in.end);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        close_client(c);
        return;
    }
    if (n < 0) return;
    c->in.end += (size_t)n;
    if (!handle_requests(c)) close_client(c);
}

static void on_server(server_t *s) {
    reserve(&s->in, READ_CHUNK);
    ssize_t n = read(s->fd, s->in.p + s->in.end, s->in.cap - s->in.end);
    if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
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

static void watch(int fd, void *who, int out, int op) {
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.ptr = who};
    epoll_ctl(ep, op, fd, &ev);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: floor-proxy LISTEN_PORT SERVER_PORT...\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
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
                if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_client(c);
            } else {
                server_t *s = evs[i].data.ptr;
                if (evs[i].events & EPOLLOUT) mark_server(s);
                if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_server(s);
            }
        }
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
