/*
 * Clients on other hosts: remote.endpoint, tcp:// with ZeroMQ CURVE. aquad's key pair encrypts
 * the connection; a ZAP handler in aquad's own loop admits only the public keys remote.clients
 * lists and names the identity each one is: its public key (ZeroMQ's User-Id, which every message
 * then carries), which remote.clients maps to a user.
 * What such a client may do is the control path alone (dispatch.c): no side channel exists to
 * carry chunk handles or tell its process.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <zmq.h>

#include "curve.h"
#include "fdguard.h"
#include "log.h"
#include "remote.h"
#include "state.h"
#include "time-util.h"
#include "turn.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
/* Refusals of tcp peers are logged at most this often (a scan must not flood the log). */
#define REFUSAL_LOG_NS (NSEC_PER_SEC)

static uint64_t refusal_log_ns, refusals_unlogged;

static void log_refusal(struct server *s, const char *fmt, ...) _printf_(2, 3);
static void log_refusal(struct server *s, const char *fmt, ...)
{
        uint64_t now = now_mono_ns();
        char text[256];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(text, sizeof(text), fmt, ap);
        va_end(ap);
        s->stats.remote_refused++;
        if (refusal_log_ns && now - refusal_log_ns < REFUSAL_LOG_NS) {
                refusals_unlogged++;
                return;
        }
        refusal_log_ns = now;
        if (refusals_unlogged)
                log_notice("Refused a tcp client: %s (and %" PRIu64 " more since the last such "
                           "message)",
                           text, refusals_unlogged);
        else
                log_notice("Refused a tcp client: %s", text);
        refusals_unlogged = 0;
        events_add(broker_events(s->broker), "refused", "tcp: %s", text);
}

static int set_ms(void *sock, int opt, uint64_t ns)
{
        int ms = (int)MIN(ns / NSEC_PER_MSEC, (uint64_t)INT32_MAX);

        return zmq_setsockopt(sock, opt, &ms, sizeof(ms));
}

/* After the ipc:// bind: ZeroMQ takes a socket's security options when it binds an endpoint,
 * so the local endpoint stays as it was and only this one speaks CURVE. */
int server_open_remote(struct server *s)
{
        const struct config_remote *rm = &s->config->remote;
        int one = 1, zero = 0;
        /* Silent tcp peers that never finish a handshake go after this (fdguard.c counts them). */
        uint64_t handshake =
            MIN(MAX(rm->heartbeat_timeout_ns * 2, 2 * NSEC_PER_SEC), 10 * NSEC_PER_SEC);

        if (!rm->endpoint)
                return 0;
        s->zap = zmq_socket(s->zctx, ZMQ_REP);
        if (!s->zap || zmq_setsockopt(s->zap, ZMQ_LINGER, &zero, sizeof(zero)) < 0 ||
            zmq_bind(s->zap, ZAP_ENDPOINT) < 0)
                return log_error_errno(-errno, "Failed to set up the ZAP handler: %s",
                                       zmq_strerror(errno));
        if (zmq_setsockopt(s->router, ZMQ_CURVE_SERVER, &one, sizeof(one)) < 0 ||
            set_ms(s->router, ZMQ_HANDSHAKE_IVL, handshake) < 0 ||
            zmq_setsockopt(s->router, ZMQ_CURVE_SECRETKEY, rm->secret_key, CURVE_KEY_TEXT) < 0 ||
            zmq_setsockopt(s->router, ZMQ_ZAP_DOMAIN, "aqua", 4) < 0 ||
            set_ms(s->router, ZMQ_HEARTBEAT_IVL, rm->heartbeat_interval_ns) < 0 ||
            set_ms(s->router, ZMQ_HEARTBEAT_TIMEOUT, rm->heartbeat_timeout_ns) < 0 ||
            set_ms(s->router, ZMQ_HEARTBEAT_TTL, rm->heartbeat_timeout_ns) < 0)
                return log_error_errno(-errno, "Failed to set CURVE options: %s",
                                       zmq_strerror(errno));
        if (zmq_bind(s->router, rm->endpoint) < 0)
                return log_error_errno(-errno, "Failed to bind %s: %s", rm->endpoint,
                                       zmq_strerror(errno));
        log_info("Serving remote clients on %s with CURVE (server key %s, %zu identities)",
                 rm->endpoint, rm->public_key, rm->n_clients);
        return 0;
}

/* One frame of a ZAP request, as text for the log (addresses, mechanisms). */
static void frame_text(zmq_msg_t *m, char *buf, size_t len)
{
        size_t n = MIN(zmq_msg_size(m), len - 1);

        memcpy(buf, zmq_msg_data(m), n);
        buf[n] = '\0';
        for (size_t i = 0; i < n; i++)
                if (buf[i] < 0x20 || buf[i] > 0x7e)
                        buf[i] = '?';
}

static void zap_reply(struct server *s, zmq_msg_t *request_id, const char *status, const char *text,
                      const char *user)
{
        zmq_send(s->zap, "1.0", 3, ZMQ_SNDMORE);
        zmq_send(s->zap, zmq_msg_data(request_id), zmq_msg_size(request_id), ZMQ_SNDMORE);
        zmq_send(s->zap, status, strlen(status), ZMQ_SNDMORE);
        zmq_send(s->zap, text, strlen(text), ZMQ_SNDMORE);
        zmq_send(s->zap, user, strlen(user), ZMQ_SNDMORE);
        zmq_send(s->zap, "", 0, 0);
}

/* RFC 27: version, request id, domain, address, routing id, mechanism, credentials... */
void server_handle_zap(struct server *s)
{
        for (;;) {
                zmq_msg_t f[8];
                size_t n = 0;
                bool more = true;
                char addr[64] = "", mech[16] = "", key[CURVE_KEY_TEXT + 1] = "?";
                const struct config_remote_client *rc = NULL;

                while (more) {
                        zmq_msg_t m;
                        zmq_msg_init(&m);
                        if (zmq_msg_recv(&m, s->zap, n ? 0 : ZMQ_DONTWAIT) < 0) {
                                zmq_msg_close(&m);
                                for (size_t i = 0; i < n; i++)
                                        zmq_msg_close(&f[i]);
                                return;
                        }
                        more = zmq_msg_more(&m);
                        if (n < ARRAY_SIZE(f))
                                f[n++] = m;
                        else
                                zmq_msg_close(&m);
                }
                if (n < 6) {
                        /* Not from libzmq; a REP must still answer to read the next one. */
                        zmq_send(s->zap, "", 0, 0);
                        goto done;
                }
                frame_text(&f[3], addr, sizeof(addr));
                frame_text(&f[5], mech, sizeof(mech));
                if (strcmp(mech, "CURVE") != 0 || n < 7 || zmq_msg_size(&f[6]) != 32) {
                        log_refusal(s, "%s: mechanism %s, only CURVE is served here", addr, mech);
                        zap_reply(s, &f[1], "400", "CURVE only", "");
                        goto done;
                }
                zmq_z85_encode(key, zmq_msg_data(&f[6]), 32);
                rc = config_remote_find(s->config, zmq_msg_data(&f[6]));
                if (!rc) {
                        log_refusal(s, "%s: public key %s is not in remote.clients", addr, key);
                        zap_reply(s, &f[1], "400", "unknown key", "");
                        goto done;
                }
                log_debug("tcp client %s authenticated as %s (key %s)", addr, rc->user, key);
                /* The key is the identity (custody is by key); remote.clients maps it to a user. */
                zap_reply(s, &f[1], "200", "OK", key);
        done:
                for (size_t i = 0; i < n; i++)
                        zmq_msg_close(&f[i]);
        }
}

/* A handshake that failed before ZAP had a say: a plain tcp client, or the wrong server key. */
void server_handle_monitor(struct server *s)
{
        for (;;) {
                zmq_msg_t ev, ep;
                uint16_t event = 0;
                uint32_t value = 0;
                char where[128] = "";

                zmq_msg_init(&ev);
                if (zmq_msg_recv(&ev, s->monitor, ZMQ_DONTWAIT) < 0) {
                        zmq_msg_close(&ev);
                        return;
                }
                if (zmq_msg_size(&ev) >= 6) {
                        memcpy(&event, zmq_msg_data(&ev), 2);
                        memcpy(&value, (uint8_t *)zmq_msg_data(&ev) + 2, 4);
                }
                zmq_msg_init(&ep);
                if (zmq_msg_more(&ev) && zmq_msg_recv(&ep, s->monitor, 0) >= 0)
                        frame_text(&ep, where, sizeof(where));
                zmq_msg_close(&ep);
                zmq_msg_close(&ev);
                fdguard_event(s, event, value, where);
                if (event != ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL &&
                    event != ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
                        continue; /* counted only */
                if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
                        continue; /* ZAP refused it and said why */
                log_refusal(s,
                            "a peer on %s failed the CURVE handshake (%s, error %" PRIu32
                            "): a plain tcp client, or one with the wrong server key",
                            where,
                            event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ? "protocol" : "no detail",
                            value);
        }
}

struct client *server_add_remote(struct server *s, const struct origin *o, uint64_t request_id)
{
        const struct config_remote_client *rc = NULL;
        struct client *c;

        rc = config_remote_find_text(s->config, o->key);
        if (!rc) {
                /* Plain tcp (plain-tcp: true), or a key a reload has removed since. */
                server_queue_error(s, o->rid, o->rlen, request_id,
                                   AQUA__ERROR_CODE__ERROR_CODE_PERMISSION,
                                   "hello: no token and no CURVE identity in remote.clients: over "
                                   "plain tcp a client needs the local side channel's token");
                return NULL;
        }
        if ((int64_t)s->n_clients >= s->config->limits.clients) {
                server_queue_error(s, o->rid, o->rlen, request_id,
                                   AQUA__ERROR_CODE__ERROR_CODE_LIMIT,
                                   "hello: the limit of %" PRId64 " clients is reached",
                                   s->config->limits.clients);
                return NULL;
        }
        c = calloc(1, sizeof(*c));
        if (!c) {
                server_queue_error(s, o->rid, o->rlen, request_id,
                                   AQUA__ERROR_CODE__ERROR_CODE_INTERNAL, "hello: out of memory");
                return NULL;
        }
        c->side_fd = -1;
        c->remote = true;
        c->cred = (struct side_cred){.pid = 0, .uid = rc->uid, .gid = (gid_t)-1};
        snprintf(c->remote_user, sizeof(c->remote_user), "%s", rc->user);
        snprintf(c->remote_key, sizeof(c->remote_key), "%s", o->key);
        snprintf(c->remote_addr, sizeof(c->remote_addr), "%s", o->addr ? o->addr : "?");
        list_init(&c->pending);
        list_init(&c->outbox);
        list_init(&c->deferred);
        c->id = s->next_client_id++;
        c->accepted_ns = c->last_seen_ns = now_mono_ns();
        memcpy(c->routing_id, o->rid, o->rlen);
        c->routing_id_len = o->rlen;
        list_append(&s->clients, &c->node);
        s->n_clients++;
        return c;
}
