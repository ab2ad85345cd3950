/* aquad's sockets, clients, signals and the poll loop; who may connect is admission.c's, requests
 * themselves go to dispatch.c. */
#include "server.h"
#include "admission.h"
#include "clients.h"
#include "descriptors.h"
#include "dispatch.h"
#include "drop.h"
#include "fdguard.h"
#include "outbox.h"
#include "reload.h"
#include "remote.h"
#include "setup.h"
#include "state.h"
#include "turn.h"

#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <zmq.h>

#include "domain.h"
#include "log.h"
#include "metrics.h"
#include "notify.h"
#include "time-util.h"
#include "translate.h"

/* How soon a notice the ROUTER could not take is tried again. */
#define OUTBOX_RETRY_MS 10

/* Registered clients count against limits.clients; the rest against limits.unregistered. */
static void read_router(struct server *s)
{
        for (int i = 0; i < SERVER_BATCH; i++) {
                zmq_msg_t id, body, extra;
                size_t frames = 2;

                zmq_msg_init(&id);
                if (zmq_msg_recv(&id, s->router, ZMQ_DONTWAIT) < 0) {
                        zmq_msg_close(&id);
                        return;
                }
                if (!zmq_msg_more(&id)) {
                        zmq_msg_close(&id);
                        continue;
                }
                zmq_msg_init(&body);
                if (zmq_msg_recv(&body, s->router, 0) < 0) {
                        zmq_msg_close(&body);
                        zmq_msg_close(&id);
                        return;
                }
                /* More parts than one: drain them, the request is malformed. */
                bool more = zmq_msg_more(&body);
                while (more) {
                        zmq_msg_init(&extra);
                        if (zmq_msg_recv(&extra, s->router, 0) < 0)
                                more = false;
                        else
                                more = zmq_msg_more(&extra);
                        zmq_msg_close(&extra);
                        frames++;
                }
                s->stats.requests++;
                if (frames > 2 || zmq_msg_size(&id) > CLIENT_MAX_ROUTING)
                        server_queue_error(s, zmq_msg_data(&id), zmq_msg_size(&id), 0,
                                           AQUA__ERROR_CODE__ERROR_CODE_MALFORMED,
                                           "a message of %zu parts; send one Envelope per message",
                                           frames - 1);
                else {
                        /* Which connection it came on: a Hello is checked against it. */
                        struct sockaddr_storage sa;
                        socklen_t salen = sizeof(sa);
                        struct origin o = {.rid = zmq_msg_data(&id), .rlen = zmq_msg_size(&id)};

                        o.fd = zmq_msg_get(&body, ZMQ_SRCFD);
                        o.remote = o.fd >= 0 &&
                                   getsockname(o.fd, (struct sockaddr *)&sa, &salen) == 0 &&
                                   (sa.ss_family == AF_INET || sa.ss_family == AF_INET6);
                        o.key = zmq_msg_gets(&body, "User-Id");
                        o.addr = zmq_msg_gets(&body, "Peer-Address");
                        if (o.key && !o.key[0])
                                o.key = NULL;
                        dispatch_envelope(s, &o, zmq_msg_data(&body), zmq_msg_size(&body));
                }
                zmq_msg_close(&body);
                zmq_msg_close(&id);
        }
}

/* What a scrape shows of the transport. */
static void show_metrics(void *userdata, struct metrics_view *v)
{
        const struct server *s = userdata;

        v->start_ns = s->start_ns;
        v->stats = &s->stats;
        v->in_domain = s->domain != NULL;
        if (s->domain)
                domain_view(s->domain, &v->domain);
        for (const struct list_node *x = s->clients.next; x != &s->clients; x = x->next) {
                const struct client *c = list_entry(x, struct client, node);
                size_t i = (size_t)client_role(c);

                v->clients_by_role[i < ARRAY_SIZE(v->clients_by_role) ? i : 0]++;
        }
}

int server_new(struct config *config, const char *config_path, unsigned flags, struct server **ret)
{
        _cleanup_(server_freep) struct server *s = NULL;
        struct broker_settings none = {0};
        int r;

        s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        s->side_fd = s->signal_fd = s->side_lock_fd = s->ipc_lock_fd = -1;
        list_init(&s->clients);
        list_init(&s->turn_out);
        list_init(&s->turn_custody);
        s->next_client_id = 1;
        s->start_ns = now_mono_ns();
        s->error_log = RATELIMIT_INIT(10 * NSEC_PER_SEC, 10);
        s->drop_log = RATELIMIT_INIT(10 * NSEC_PER_SEC, 10);
        s->config_path = strdup(config_path);
        if (!s->config_path)
                return -ENOMEM;
        r = broker_new(&none, &s->broker);
        if (r < 0)
                return r;
        s->config = config;
        server_apply_settings(s);
        /* The sockets' locks first: an aquad that may not serve them touches nothing. */
        r = flags & SERVER_UNBOUND ? 0 : server_lock_sockets(s);
        /* In a domain, lead first: one that waits has bound nothing and read nothing. */
        if (r >= 0 && config->domain.n_etcd) {
                r = domain_new(&config->domain, config->remote.endpoint, &s->domain);
                if (r < 0)
                        log_error_errno(r, "Failed to set up the domain's etcd client: %m");
                else
                        r = domain_campaign(s->domain, NULL);
        }
        if (r >= 0)
                r = server_open_journal(s, flags & SERVER_REPAIR_JOURNAL);
        /* A leader that cannot start gives up the lead at once, not after its TTL. */
        if (r < 0 && s->domain)
                domain_resign(s->domain);
        /* After the journal, whose operator pins win over the config's on the same GPUs. */
        if (r >= 0)
                r = server_apply_pins(s);
        if (r < 0) {
                s->config = NULL; /* the caller still owns it on failure */
                return r;
        }
        if (flags & SERVER_UNBOUND) {
                *ret = TAKE_PTR(s);
                return 0;
        }
        s->fd_limit = server_raise_fd_limit();
        r = server_open_signals(s);
        if (r >= 0)
                r = server_open_side(s);
        if (r >= 0)
                r = server_open_router(s);
        if (r >= 0 && s->config->metrics)
                r = metrics_new(s->broker, s->config->metrics, show_metrics, s, &s->metrics);
        if (r >= 0)
                r = broker_recompute_pairs(s->broker);
        if (r < 0) {
                s->config = NULL;
                return r;
        }
        *ret = TAKE_PTR(s);
        return 0;
}

struct server *server_free(struct server *s)
{
        if (!s)
                return NULL;
        if (s->turn_out.next)
                server_turn_clear(s);
        while (!list_empty(&s->clients)) {
                struct client *c = list_entry(s->clients.next, struct client, node);
                /* Not a client death: their state stays in the journal for the next start. */
                c->gpu = NULL;
                server_outbox_clear(s, c);
                client_free_held(s, c);
                while (!list_empty(&c->pending))
                        client_free_pending(c, list_entry(c->pending.next, struct pending, node));
                list_unlink(&c->node);
                safe_close(c->side_fd);
                free(c);
        }
        if (s->monitor) {
                fdguard_close(s);
                zmq_socket_monitor(s->router, NULL, 0);
                zmq_close(s->monitor);
        }
        if (s->zap)
                zmq_close(s->zap);
        if (s->router)
                zmq_close(s->router);
        if (s->zctx)
                zmq_ctx_term(s->zctx);
        /* Only the holder of its lock may: another aquad's socket may be at that path. */
        if (s->side_fd >= 0 && s->side_lock_fd >= 0 && s->config)
                unlink(s->config->side_socket);
        safe_close(s->side_fd);
        /* Released once both sockets are gone, so the next aquad does not lose its own. */
        safe_close(s->side_lock_fd);
        safe_close(s->ipc_lock_fd);
        safe_close(s->signal_fd);
        metrics_free(s->metrics);
        broker_free(s->broker);
        domain_free(s->domain);
        config_free(s->config);
        free(s->ipc_path);
        free(s->config_path);
        free(s);
        return NULL;
}

void server_set_ready(struct server *s, server_ready_fn fn, void *userdata)
{
        s->on_ready = fn;
        s->ready_userdata = userdata;
}

/* ------------------------------------------------------------------------------ the loop */

static void stop(struct server *s, const char *why)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__DaemonStopping st = AQUA__DAEMON_STOPPING__INIT;
        Aquaj__JournalRecord *snap = NULL;
        int linger = 1000;

        log_notice("Stopping (%s): telling %zu clients", why, s->n_clients);
        notify_stopping(why);
        s->stopping = true;
        st.reason = (char *)why;
        e.body_case = AQUA__ENVELOPE__BODY_STOPPING;
        e.stopping = &st;
        for (struct list_node *n = s->clients.next; n != &s->clients; n = n->next) {
                struct client *c = list_entry(n, struct client, node);
                if (c->registered)
                        server_queue(s, c, &e);
        }
        server_end_turn(s);
        /* Leave a compact journal for the next start (a deposed leader writes nothing). */
        if (s->exit_status != -ESTALE && broker_journal(s->broker) &&
            broker_snapshot(s->broker, &snap) >= 0) {
                int r = journal_compact(broker_journal(s->broker), snap);
                if (r < 0)
                        log_warning_errno(r, "Failed to compact the journal at stop: %m");
                aquaj__journal_record__free_unpacked(snap, NULL);
        }
        if (s->domain && s->exit_status != -ESTALE)
                domain_resign(s->domain);
        /* Give the stopping notices time to leave. */
        zmq_setsockopt(s->router, ZMQ_LINGER, &linger, sizeof(linger));
}

static void step_down(struct server *s)
{
        const char *why = domain_lost(s->domain);

        if (s->stopping)
                return;
        /* The fence refused a commit before the lease said anything: etcd's answer is why. */
        if (!why[0] && broker_journal(s->broker))
                why = journal_error(broker_journal(s->broker));
        log_error("Lost the lead of domain %s: %s; stopping without writing or answering "
                  "anything more (another aquad leads; this one campaigns again when restarted)",
                  s->config->domain.name, why[0] ? why : "etcd refused a commit");
        s->exit_status = -ESTALE;
        stop(s, "lost the lead of the domain");
}

static void handle_signals(struct server *s)
{
        struct signalfd_siginfo si;

        while (read(s->signal_fd, &si, sizeof(si)) == sizeof(si)) {
                switch (si.ssi_signo) {
                case SIGHUP:
                        (void)server_reload(s, NULL, 0, NULL, 0);
                        break;
                case SIGTERM:
                case SIGINT:
                        if (!s->stopping)
                                stop(s, si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
                        break;
                default:
                        break;
                }
        }
}

/*
 * Whether silence may end a remote client's registration: any remote one's, and its GPU then
 * keeps what it holds as after an aquad restart (server_detach_gpu). A remote consumer is never
 * taken for dead because it is silent: no side channel and no process table across hosts can
 * prove it gone, and a fabric mapping keeps memory alive after its exporter let go, so its
 * leases stay, their chunks granted to nobody (the producer's reuse waits), until it
 * re-registers them, returns them, or an operator releases it, as for a client whose process
 * cannot be identified ("Silence is not death"). A remote producer that does not register
 * again within reconcile-timeout is treated as gone, as after a restart: its consumers are
 * asked to move off, which loses nothing.
 */
static bool remote_may_lapse(const struct client *c)
{
        return c->remote;
}

static uint64_t next_deadline(struct server *s)
{
        struct broker_counts counts;

        broker_counts(s->broker, &counts);
        uint64_t next = counts.next_deadline_ns, turn = server_turn_deadline(s);

        if (turn && (!next || turn < next))
                next = turn;
        uint64_t lead = s->domain ? domain_deadline(s->domain) : 0;
        if (lead && (!next || lead < next))
                next = lead;

        for (struct list_node *n = s->clients.next; n != &s->clients; n = n->next) {
                struct client *c = list_entry(n, struct client, node);
                if (!c->registered && (!next || c->hello_deadline_ns < next))
                        next = c->hello_deadline_ns;
                if (remote_may_lapse(c)) {
                        uint64_t d = c->last_seen_ns + s->config->remote.grace_ns;
                        if (!next || d < next)
                                next = d;
                }
                for (struct list_node *k = c->pending.next; k != &c->pending; k = k->next) {
                        uint64_t d = list_entry(k, struct pending, node)->deadline_ns;
                        if (!next || d < next)
                                next = d;
                }
        }
        return next;
}

static void expire(struct server *s, uint64_t now)
{
        struct list_node *pos, *tmp;

        server_turn_barrier(s);
        broker_tick(s->broker, now);
        list_for_each(pos, tmp, &s->clients)
        {
                struct client *c = list_entry(pos, struct client, node);
                if (!c->registered && now >= c->hello_deadline_ns) {
                        log_notice("Client %" PRIu64 " (pid %d) sent no Hello in time; closing "
                                   "its side channel",
                                   c->id, (int)c->cred.pid);
                        server_drop_client(s, c);
                        /* Dropping it may have freed no other client, but restart to be safe. */
                        tmp = s->clients.next;
                        continue;
                }
                /* Past its grace of silence a remote registration that holds nothing goes;
                 * it may say Hello again. */
                if (remote_may_lapse(c) && now >= c->last_seen_ns + s->config->remote.grace_ns) {
                        if (c->gpu && broker_gpu_role(c->gpu) == GPU_ROLE_PRODUCER)
                                log_notice("Remote client %" PRIu64
                                           " (%s at %s) silent for %" PRIu64
                                           " ms (remote.grace); dropping its registration, GPU "
                                           "%s lends nothing until it registers again, and is "
                                           "treated as gone if it does not within "
                                           "reconcile-timeout",
                                           c->id, c->remote_user, c->remote_addr,
                                           s->config->remote.grace_ns / NSEC_PER_MSEC,
                                           broker_gpu_uuid(c->gpu));
                        else if (c->gpu)
                                log_notice("Remote client %" PRIu64
                                           " (%s at %s) silent for %" PRIu64
                                           " ms (remote.grace); dropping its registration, GPU "
                                           "%s keeps its %zu leases until it re-registers them "
                                           "or an operator releases it",
                                           c->id, c->remote_user, c->remote_addr,
                                           s->config->remote.grace_ns / NSEC_PER_MSEC,
                                           broker_gpu_uuid(c->gpu), broker_gpu_leases(c->gpu));
                        else
                                log_notice("Remote client %" PRIu64
                                           " (%s at %s) silent for %" PRIu64
                                           " ms (remote.grace); dropping its registration, which "
                                           "holds no memory",
                                           c->id, c->remote_user, c->remote_addr,
                                           s->config->remote.grace_ns / NSEC_PER_MSEC);
                        server_detach_gpu(s, c);
                        tmp = s->clients.next;
                        continue;
                }
                pending_expire(s, c, now);
        }
}

int server_run(struct server *s)
{
        _cleanup_free_ zmq_pollitem_t *items = NULL;
        _cleanup_free_ struct client **owners = NULL;
        size_t alloc = 0;

        if (s->domain)
                log_info("Serving %s (side channel %s), journal in etcd under %s",
                         s->config->endpoint, s->config->side_socket,
                         domain_journal_prefix(s->domain));
        else
                log_info("Serving %s (side channel %s), journal %s", s->config->endpoint,
                         s->config->side_socket, s->config->journal);
        if (s->on_ready)
                s->on_ready(s, s->ready_userdata);

        while (!s->stopping) {
                size_t n = 6 + s->n_clients, k = 3, metrics_item = 0, zap_item = 0,
                       monitor_item = 0;
                uint64_t deadline = next_deadline(s);
                long timeout = -1;
                int r;

                if (n > alloc) {
                        zmq_pollitem_t *a = reallocarray(items, n * 2, sizeof(*a));
                        struct client **o = reallocarray(owners, n * 2, sizeof(*o));
                        if (a)
                                items = a;
                        if (o)
                                owners = o;
                        if (!a || !o)
                                return log_error_errno(-ENOMEM, "Out of memory polling");
                        alloc = n * 2;
                }
                items[0] = (zmq_pollitem_t){.socket = s->router, .events = ZMQ_POLLIN};
                /* Out of descriptors: the listener waits; queued connections stay queued. */
                items[1] = (zmq_pollitem_t){.fd = s->side_fd,
                                            .events = s->accept_paused_ns ? 0 : ZMQ_POLLIN};
                items[2] = (zmq_pollitem_t){.fd = s->signal_fd, .events = ZMQ_POLLIN};
                for (struct list_node *x = s->clients.next; x != &s->clients; x = x->next) {
                        owners[k] = list_entry(x, struct client, node);
                        if (owners[k]->side_fd < 0)
                                continue; /* remote: no side channel */
                        items[k] = (zmq_pollitem_t){.fd = owners[k]->side_fd, .events = ZMQ_POLLIN};
                        k++;
                }
                if (s->zap) {
                        zap_item = k;
                        owners[k] = NULL;
                        items[k++] = (zmq_pollitem_t){.socket = s->zap, .events = ZMQ_POLLIN};
                }
                if (s->monitor) {
                        monitor_item = k;
                        owners[k] = NULL;
                        items[k++] = (zmq_pollitem_t){.socket = s->monitor, .events = ZMQ_POLLIN};
                }
                if (deadline)
                        timeout = ms_until(deadline) + 1;
                if (s->accept_paused_ns) {
                        long left = ms_until(s->accept_paused_ns) + 1;
                        if (timeout < 0 || left < timeout)
                                timeout = left;
                }
                /* A paused listener resumes when descriptors are back: look again soon. */
                if (fdguard_paused(s) && (timeout < 0 || timeout > 100))
                        timeout = 100;
                /* Notices the ROUTER could not take: try again soon (no per-peer POLLOUT). */
                if (s->n_outbox && (timeout < 0 || timeout > OUTBOX_RETRY_MS))
                        timeout = OUTBOX_RETRY_MS;
                if (s->metrics) {
                        int mt = metrics_timeout_ms(s->metrics), mfd = metrics_fd(s->metrics);

                        if (mfd >= 0) {
                                metrics_item = k;
                                owners[k] = NULL;
                                items[k++] = (zmq_pollitem_t){.fd = mfd, .events = ZMQ_POLLIN};
                        }
                        if (mt >= 0 && (timeout < 0 || mt < timeout))
                                timeout = mt;
                }
                r = zmq_poll(items, (int)k, timeout);
                if (r < 0) {
                        if (errno == EINTR)
                                continue;
                        return log_error_errno(-errno, "zmq_poll failed: %s", zmq_strerror(errno));
                }
                if (items[2].revents)
                        handle_signals(s);
                if (s->stopping)
                        break;
                /* A leader that may have lost its lease reads nothing more. */
                if (s->domain && domain_tick(s->domain, now_mono_ns()) < 0) {
                        step_down(s);
                        break;
                }
                /* Side channels first: a client's death (EOF) or its fds come before its
                 * requests that may depend on them. */
                for (size_t i = 3; i < k; i++)
                        if (items[i].revents && owners[i])
                                admission_read_side(s, owners[i]);
                if (zap_item && items[zap_item].revents)
                        server_handle_zap(s);
                if (monitor_item && items[monitor_item].revents)
                        server_handle_monitor(s);
                fdguard_check(s, now_mono_ns());
                if (items[1].revents || s->accept_paused_ns)
                        admission_accept_side(s);
                if (items[0].revents)
                        read_router(s);
                expire(s, now_mono_ns());
                /* One commit for all of it, then what it says leaves. */
                server_end_turn(s);
                /* The commit's fence held no more: another leads. */
                if (s->deposed) {
                        step_down(s);
                        break;
                }
                /* Scrapes are served between requests, from the state they left. */
                if (s->metrics && ((metrics_item && items[metrics_item].revents) ||
                                   metrics_timeout_ms(s->metrics) == 0))
                        metrics_dispatch(s->metrics);
                notify_status(s->broker, s->n_clients);
        }
        return s->exit_status;
}
