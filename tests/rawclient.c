/* The raw protocol client: just enough of libaqua's job to drive aquad by hand. */
#include "rawclient.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include "util.h"
#include "wire.h"

int raw_connect(struct raw *r, const char *endpoint, const char *side_path)
{
        return raw_connect_ctx(r, NULL, endpoint, side_path);
}

int raw_connect_ctx(struct raw *r, void *ctx, const char *endpoint, const char *side_path)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        Aqua__SideFrame *f = NULL;
        struct pollfd p;
        size_t n = 0;
        int linger = 0, rc;

        memset(r, 0, sizeof(*r));
        r->next_id = 1;
        r->side = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (r->side < 0)
                return -errno;
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", side_path);
        if (connect(r->side, (struct sockaddr *)&sa, sizeof(sa)) < 0)
                return -errno;
        p = (struct pollfd){.fd = r->side, .events = POLLIN};
        if (poll(&p, 1, RAW_TIMEOUT_MS) != 1)
                return -ETIMEDOUT;
        rc = side_recv(r->side, &f, NULL, 0, &n);
        if (rc != 0)
                return rc > 0 ? -EPROTO : rc;
        if (f->kind == AQUA__SIDE_FRAME__KIND__KIND_REJECT) {
                snprintf(r->reject, sizeof(r->reject), "%s", f->text);
                aqua__side_frame__free_unpacked(f, NULL);
                return 1;
        }
        if (f->kind != AQUA__SIDE_FRAME__KIND__KIND_HELLO || f->token.len != SIDE_TOKEN_LEN) {
                aqua__side_frame__free_unpacked(f, NULL);
                return -EPROTO;
        }
        memcpy(r->token, f->token.data, SIDE_TOKEN_LEN);
        aqua__side_frame__free_unpacked(f, NULL);

        r->own_ctx = !ctx;
        r->ctx = ctx ? ctx : zmq_ctx_new();
        r->dealer = r->ctx ? zmq_socket(r->ctx, ZMQ_DEALER) : NULL;
        if (!r->dealer)
                return -errno;
        zmq_setsockopt(r->dealer, ZMQ_LINGER, &linger, sizeof(linger));
        if (zmq_connect(r->dealer, endpoint) < 0)
                return -errno;
        return 0;
}

void raw_close(struct raw *r)
{
        /* Never connected (a zeroed struct): nothing to close, and fd 0 is not ours. */
        if (!r->ctx && !r->dealer && r->side == 0)
                return;
        for (size_t i = 0; i < r->n_notices; i++)
                raw_free(r->notices[i]);
        r->n_notices = 0;
        if (r->dealer)
                zmq_close(r->dealer);
        if (r->ctx && r->own_ctx)
                zmq_ctx_term(r->ctx);
        r->dealer = r->ctx = NULL;
        r->side = safe_close(r->side);
}

void raw_free(Aqua__Envelope *e)
{
        if (e)
                aqua__envelope__free_unpacked(e, NULL);
}

int raw_error_code(const Aqua__Envelope *e)
{
        return e && e->body_case == AQUA__ENVELOPE__BODY_ERROR ? (int)e->error->code : -1;
}

int raw_send(struct raw *r, Aqua__Envelope *e)
{
        _cleanup_free_ void *buf = NULL;
        size_t n;
        uint64_t id = e->request_id;

        if (wire_encode(e, &buf, &n) < 0)
                return -ENOMEM;
        e->request_id = id;
        return zmq_send(r->dealer, buf, n, 0) < 0 ? -errno : 0;
}

static Aqua__Envelope *recv_one(struct raw *r, int timeout_ms)
{
        zmq_pollitem_t item = {.socket = r->dealer, .events = ZMQ_POLLIN};
        struct wire_limits lim = WIRE_LIMITS_DEFAULT;
        Aqua__Envelope *e = NULL;
        zmq_msg_t m;

        lim.max_message = 64u << 20;
        lim.max_repeated = 1u << 20;
        if (zmq_poll(&item, 1, timeout_ms) != 1)
                return NULL;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, r->dealer, 0) < 0) {
                zmq_msg_close(&m);
                return NULL;
        }
        if (wire_decode(zmq_msg_data(&m), zmq_msg_size(&m), &lim, &e, NULL, 0) != 0)
                e = NULL;
        zmq_msg_close(&m);
        return e;
}

Aqua__Envelope *raw_recv(struct raw *r, int timeout_ms)
{
        return recv_one(r, timeout_ms);
}

static bool take_notice(struct raw *r, Aqua__Envelope__BodyCase body, Aqua__Envelope **ret)
{
        for (size_t i = 0; i < r->n_notices; i++)
                if (r->notices[i]->body_case == body) {
                        *ret = r->notices[i];
                        memmove(r->notices + i, r->notices + i + 1,
                                (r->n_notices - i - 1) * sizeof(*r->notices));
                        r->n_notices--;
                        return true;
                }
        return false;
}

Aqua__Envelope *raw_wait(struct raw *r, uint64_t id, Aqua__Envelope__BodyCase body, int timeout_ms)
{
        Aqua__Envelope *e;

        if (id == 0 && take_notice(r, body, &e))
                return e;
        for (;;) {
                e = recv_one(r, timeout_ms);
                if (!e)
                        return NULL;
                if (id != 0 && e->request_id == id)
                        return e;
                if (id == 0 && e->request_id == 0 && e->body_case == body)
                        return e;
                if (e->request_id == 0 && r->n_notices < RAW_MAX_NOTICES)
                        r->notices[r->n_notices++] = e;
                else
                        raw_free(e);
        }
}

Aqua__Envelope *raw_call(struct raw *r, Aqua__Envelope *e)
{
        e->request_id = r->next_id++;
        if (raw_send(r, e) < 0)
                return NULL;
        return raw_wait(r, e->request_id, 0, RAW_TIMEOUT_MS);
}

Aqua__Envelope *raw_call_bytes(struct raw *r, const void *data, size_t len, uint64_t id)
{
        if (zmq_send(r->dealer, data, len, 0) < 0)
                return NULL;
        /* Undecodable requests are answered with request id 0. */
        return raw_wait(r, id, id ? 0 : AQUA__ENVELOPE__BODY_ERROR, RAW_TIMEOUT_MS);
}

/* The custody secrets Welcomes gave this process, by GPU uuid. */
#define RAW_SECRETS 64
static struct {
        char uuid[64];
        uint8_t secret[32];
} secrets[RAW_SECRETS];

static uint8_t *secret_of(const char *uuid, bool add)
{
        for (size_t i = 0; uuid && i < RAW_SECRETS; i++)
                if (strcmp(secrets[i].uuid, uuid) == 0 || (add && !secrets[i].uuid[0])) {
                        snprintf(secrets[i].uuid, sizeof(secrets[i].uuid), "%s", uuid);
                        return secrets[i].secret;
                }
        return NULL;
}

void raw_forget_secrets(void)
{
        memset(secrets, 0, sizeof(secrets));
}

Aqua__Envelope *raw_hello(struct raw *r, Aqua__Role role, const char *uuid, const char *peer,
                          Aqua__HeldChunk **held, size_t n_held, const int *fds)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *w;
        Aqua__Hello h = AQUA__HELLO__INIT;
        Aqua__PeerLink link = AQUA__PEER_LINK__INIT, *links[] = {&link};
        uint8_t *secret = r->no_secret ? NULL : secret_of(uuid, false);

        h.token = (ProtobufCBinaryData){.len = SIDE_TOKEN_LEN, .data = r->token};
        h.role = role;
        h.gpu_uuid = (char *)(uuid ? uuid : "");
        h.gpu_capacity = UINT64_C(80) << 30;
        h.granularity = 2u << 20;
        h.client_name = (char *)"rawclient";
        h.host = (char *)(r->host ? r->host : "");
        h.held = held;
        h.n_held = n_held;
        if (secret)
                h.custody_secret = (ProtobufCBinaryData){.len = 32, .data = secret};
        if (peer) {
                link.gpu_uuid = (char *)peer;
                link.bandwidth_gbps = 450;
                h.links = links;
                h.n_links = 1;
        }
        e.body_case = AQUA__ENVELOPE__BODY_HELLO;
        e.hello = &h;
        e.request_id = r->next_id++;
        if (r->device_node) {
                Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
                f.kind = AQUA__SIDE_FRAME__KIND__KIND_DEVICE_FD;
                f.request_id = e.request_id;
                h.device_node = true;
                if (side_send(r->side, &f, &r->device_fd, 1) < 0)
                        return NULL;
        }
        if (role == AQUA__ROLE__ROLE_PRODUCER && n_held > 0) {
                Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
                f.kind = AQUA__SIDE_FRAME__KIND__KIND_REREGISTER_FDS;
                f.request_id = e.request_id;
                if (side_send(r->side, &f, fds, n_held) < 0)
                        return NULL;
        }
        if (raw_send(r, &e) < 0)
                return NULL;
        w = raw_wait(r, e.request_id, 0, RAW_TIMEOUT_MS);
        if (w && w->body_case == AQUA__ENVELOPE__BODY_WELCOME &&
            w->welcome->custody_secret.len == 32 && (secret = secret_of(uuid, true)))
                memcpy(secret, w->welcome->custody_secret.data, 32);
        return w;
}

int raw_memfd(uint64_t size, const char *text)
{
        char buf[64];
        size_t len = (size_t)snprintf(buf, sizeof(buf), "%s", text) + 1;
        int fd = memfd_create("chunk", MFD_CLOEXEC);

        if (fd < 0)
                return -errno;
        if (len > sizeof(buf) || ftruncate(fd, (off_t)size) < 0 ||
            pwrite(fd, buf, len, 0) != (ssize_t)len) {
                close(fd);
                return -EIO;
        }
        return fd;
}

bool raw_memfd_has(int fd, const char *text)
{
        char buf[64] = "";
        size_t n = strlen(text) + 1;

        return n <= sizeof(buf) && pread(fd, buf, n, 0) == (ssize_t)n && memcmp(buf, text, n) == 0;
}

Aqua__Envelope *raw_offer(struct raw *r, size_t n, uint64_t size, int *fds_out)
{
        Aqua__Envelope *reply;
        int fds[64] = {0};

        if (n > 64)
                return NULL;
        for (size_t i = 0; i < n; i++) {
                char text[32];
                snprintf(text, sizeof(text), "chunk %zu", i);
                fds[i] = raw_memfd(size, text);
        }
        reply = raw_offer_fds(r, fds, n, size);
        for (size_t i = 0; i < n; i++) {
                if (fds_out)
                        fds_out[i] = fds[i];
                else
                        close(fds[i]);
        }
        return reply;
}

Aqua__Envelope *raw_offer_fds(struct raw *r, const int *fds, size_t n, uint64_t size)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Offer o = AQUA__OFFER__INIT;
        Aqua__ChunkOffer co[64], *cop[64];
        Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;

        if (n > 64)
                return NULL;
        for (size_t i = 0; i < n; i++) {
                aqua__chunk_offer__init(&co[i]);
                co[i].client_ref = i;
                co[i].size = size;
                cop[i] = &co[i];
        }
        o.chunks = cop;
        o.n_chunks = n;
        e.body_case = AQUA__ENVELOPE__BODY_OFFER;
        e.offer = &o;
        e.request_id = r->next_id++;
        /* The fds go first here; aquad takes either order. */
        f.kind = AQUA__SIDE_FRAME__KIND__KIND_OFFER_FDS;
        f.request_id = e.request_id;
        if (side_send(r->side, &f, fds, n) < 0)
                return NULL;
        if (raw_send(r, &e) < 0)
                return NULL;
        return raw_wait(r, e.request_id, 0, RAW_TIMEOUT_MS);
}

Aqua__Envelope *raw_borrow(struct raw *r, uint64_t bytes, uint64_t min, bool dram, int *fds,
                           size_t max, size_t *ret_n)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *reply;
        Aqua__Borrow b = AQUA__BORROW__INIT;

        b.bytes = bytes;
        b.min_bytes = min;
        b.allow_dram = dram;
        e.body_case = AQUA__ENVELOPE__BODY_BORROW;
        e.borrow = &b;
        reply = raw_call(r, &e);
        *ret_n = 0;
        if (reply && reply->body_case == AQUA__ENVELOPE__BODY_GRANT && reply->grant->lease_id) {
                /* The descriptors were sent before the Grant. */
                Aqua__SideFrame *f = NULL;
                struct pollfd p = {.fd = r->side, .events = POLLIN};
                size_t n = 0;

                if (poll(&p, 1, RAW_TIMEOUT_MS) != 1 || side_recv(r->side, &f, fds, max, &n) != 0) {
                        raw_free(reply);
                        return NULL;
                }
                if (f->kind != AQUA__SIDE_FRAME__KIND__KIND_GRANT_FDS ||
                    f->lease_id != reply->grant->lease_id || n != reply->grant->n_chunks) {
                        side_close_fds(fds, n);
                        aqua__side_frame__free_unpacked(f, NULL);
                        raw_free(reply);
                        return NULL;
                }
                aqua__side_frame__free_unpacked(f, NULL);
                *ret_n = n;
        }
        return reply;
}

Aqua__Envelope *raw_admin_query(struct raw *r, Aqua__AdminQuery__What what)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__AdminQuery q = AQUA__ADMIN_QUERY__INIT;

        q.what = what;
        e.body_case = AQUA__ENVELOPE__BODY_ADMIN_QUERY;
        e.admin_query = &q;
        return raw_call(r, &e);
}
