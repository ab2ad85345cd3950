/* Setting aquad up: the sockets' locks, the journal's replay (or repair), descriptors, signals,
 * the side-channel listener and the ROUTER. server_new() calls these in order. */
#include "setup.h"
#include "fdguard.h"
#include "remote.h"
#include "state.h"

#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <zmq.h>

#include "domain.h"
#include "etcd.h"
#include "log.h"
#include "time-util.h"
#include "trust.h"

/* Every chunk in the pool is a descriptor the daemon holds: as many as it may. Returns the
 * limit it runs with (0: none it can tell). */
uint64_t server_raise_fd_limit(void)
{
        struct rlimit rl;

        if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
                return 0;
        if (rl.rlim_cur < rl.rlim_max) {
                rl.rlim_cur = rl.rlim_max;
                (void)setrlimit(RLIMIT_NOFILE, &rl);
                (void)getrlimit(RLIMIT_NOFILE, &rl);
        }
        return rl.rlim_cur == RLIM_INFINITY ? 0 : rl.rlim_cur;
}

static int make_parent_dir(const char *path)
{
        _cleanup_free_ char *dir = strdup(path);
        char *slash;

        if (!dir)
                return -ENOMEM;
        slash = strrchr(dir, '/');
        if (!slash || slash == dir)
                return 0;
        *slash = '\0';
        if (mkdir(dir, 0755) < 0 && errno != EEXIST)
                return -errno;
        return 0;
}

static int set_socket_access(const struct config *c, const char *path)
{
        if (chmod(path, c->socket_mode) < 0)
                return -errno;
        if (c->socket_group) {
                struct group *gr = getgrnam(c->socket_group);
                gid_t gid = gr ? gr->gr_gid : (gid_t)strtoul(c->socket_group, NULL, 10);
                if (chown(path, (uid_t)-1, gid) < 0)
                        return -errno;
        }
        return 0;
}

/*
 * One aquad per socket: <path>.lock, locked for aquad's life and holding its pid, is taken before
 * the socket is unlinked. Without it a second aquad (another journal, so the journal's lock
 * cannot tell) would unlink the socket of one that runs, bind its own, and delete it at exit,
 * leaving the first one unreachable. The file stays when aquad exits: unlinking it would let two
 * aquads lock two different files of that name.
 */
static int lock_socket(const char *path, int *ret_fd)
{
        _cleanup_free_ char *lock = NULL;
        _cleanup_close_ int fd = -1;
        char pid[32];
        ssize_t n;
        int r;

        char why[PATH_MAX + 128], owner[64];
        struct stat st;

        r = make_parent_dir(path);
        if (r < 0)
                return log_error_errno(r, "Failed to create the folder of %s: %m", path);
        /* Again now that it exists: someone else may have made it since the config's check. */
        r = trust_parent(path, geteuid(), why, sizeof(why));
        if (r < 0)
                return log_error_errno(r, "Refusing to serve %s: %s", path, why);
        if (asprintf(&lock, "%s.lock", path) < 0)
                return log_error_errno(-ENOMEM, "Failed to lock %s: %m", path);
        fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0)
                return log_error_errno(-errno, "Failed to open %s: %m", lock);
        if (fstat(fd, &st) < 0)
                return log_error_errno(-errno, "Failed to open %s: %m", lock);
        if (!S_ISREG(st.st_mode) || st.st_uid != geteuid())
                return log_error_errno(-EPERM,
                                       "Refusing the lock file %s: it belongs to %s, not to "
                                       "aquad's user; aquad takes only a lock it made",
                                       lock, trust_user_name(st.st_uid, owner, sizeof(owner)));
        if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
                if (errno != EWOULDBLOCK)
                        return log_error_errno(-errno, "Failed to lock %s: %m", lock);
                /* Empty for a moment while the holder writes it. */
                n = pread(fd, pid, sizeof(pid) - 1, 0);
                pid[MAX(n, 0)] = '\0';
                pid[strcspn(pid, "\n")] = '\0';
                return log_error_errno(-EBUSY,
                                       "%s is served by another aquad (pid %s, holding %s); stop "
                                       "it, or give this one another endpoint and side-socket",
                                       path, pid[0] ? pid : "unknown", lock);
        }
        n = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
        if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)n, 0) != n)
                return log_error_errno(-errno, "Failed to write %s: %m", lock);
        *ret_fd = TAKE_FD(fd);
        return 0;
}

/* The side socket's lock, and the ipc:// endpoint's where that is another file. */
int server_lock_sockets(struct server *s)
{
        const char *ep = s->config->endpoint;
        _cleanup_free_ char *error = NULL;
        int r;

        /* Nothing but a socket an aquad left is ever replaced (ZeroMQ unlinks before binding). */
        r = config_check_paths(s->config, &error);
        if (r < 0)
                return log_error_errno(r, "Refusing to start: %s", error ? error : "bad path");

        r = lock_socket(s->config->side_socket, &s->side_lock_fd);
        if (r < 0 || strncmp(ep, "ipc://", 6) != 0)
                return r;
        s->ipc_path = strdup(ep + 6);
        if (!s->ipc_path)
                return log_error_errno(-ENOMEM, "Failed to lock %s: %m", ep + 6);
        if (strcmp(s->ipc_path, s->config->side_socket) == 0)
                return 0;
        return lock_socket(s->ipc_path, &s->ipc_lock_fd);
}

int server_open_side(struct server *s)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        const char *path = s->config->side_socket;
        struct stat st;
        int r;

        s->side_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (s->side_fd < 0)
                return log_error_errno(-errno, "Failed to create the side-channel socket: %m");
        /* A socket left by an aquad that died: the socket's lock (ours now) says none runs. */
        if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
                unlink(path);
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        if (bind(s->side_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
                return log_error_errno(-errno, "Failed to bind %s: %m", path);
        r = set_socket_access(s->config, path);
        if (r < 0)
                return log_error_errno(r, "Failed to set the mode or group of %s: %m", path);
        if (listen(s->side_fd, 128) < 0)
                return log_error_errno(-errno, "Failed to listen on %s: %m", path);
        return 0;
}

int server_open_router(struct server *s)
{
        const char *ep = s->config->endpoint;
        int one = 1, zero = 0;
        /* Messages up to this size get an error reply; larger ones cost the peer its pipe. */
        int64_t max = MAX((int64_t)s->config->limits.message_size * 4, INT64_C(16) << 20);
        int r;

        s->zctx = zmq_ctx_new();
        if (!s->zctx)
                return log_error_errno(-errno, "Failed to create a ZeroMQ context: %m");
        s->router = zmq_socket(s->zctx, ZMQ_ROUTER);
        if (!s->router)
                return log_error_errno(-errno, "Failed to create the ROUTER socket: %m");
        if (zmq_setsockopt(s->router, ZMQ_ROUTER_MANDATORY, &one, sizeof(one)) < 0 ||
            zmq_setsockopt(s->router, ZMQ_LINGER, &zero, sizeof(zero)) < 0 ||
            zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &max, sizeof(max)) < 0)
                return log_error_errno(-errno, "Failed to set ROUTER options: %m");
        r = fdguard_open(s);
        if (r < 0)
                return r;
        /* ZeroMQ unlinks an ipc:// file before it binds: lock_sockets() made that safe. */
        if (zmq_bind(s->router, ep) < 0)
                return log_error_errno(-errno, "Failed to bind %s: %s", ep, zmq_strerror(errno));
        if (s->ipc_path) {
                r = set_socket_access(s->config, s->ipc_path);
                if (r < 0)
                        return log_error_errno(r, "Failed to set the mode or group of %s: %m",
                                               s->ipc_path);
        }
        return server_open_remote(s);
}

int server_open_signals(struct server *s)
{
        sigset_t mask;

        sigemptyset(&mask);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGINT);
        sigaddset(&mask, SIGHUP);
        if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
                return -errno;
        s->signal_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
        if (s->signal_fd < 0)
                return log_error_errno(-errno, "Failed to create a signalfd: %m");
        signal(SIGPIPE, SIG_IGN);
        /* A journal past the file size limit is a failed write to refuse on, not a crash. */
        signal(SIGXFSZ, SIG_IGN);
        return 0;
}

/* Where --repair-journal keeps the damaged journal: beside it, named by the time (UTC). */
static int repair_copy_path(const char *journal, char **ret)
{
        char stamp[32];
        time_t now = time(NULL);
        struct tm tm;

        if (!gmtime_r(&now, &tm) || !strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm))
                return -EINVAL;
        return asprintf(ret, "%s.corrupt-%s", journal, stamp) < 0 ? -ENOMEM : 0;
}

int server_open_journal(struct server *s, bool repair)
{
        const char *path = s->config->journal;
        struct journal_replay_stats st = {0};
        _cleanup_free_ char *copy = NULL;
        struct journal *j = NULL;
        int r;

        if (s->domain) {
                struct journal_fence fence = domain_fence(s->domain);

                r = journal_open_etcd(domain_etcd(s->domain), domain_journal_prefix(s->domain),
                                      &fence, broker_apply, s->broker, &j, &st);
                if (r == -EUCLEAN)
                        return log_error_errno(r,
                                               "The domain's journal in etcd (%s) has a record "
                                               "that does not decode, the %" PRIu64 "th (%" PRIu64
                                               " after it): not leading with a part of it",
                                               domain_journal_prefix(s->domain), st.bad_offset,
                                               st.records_after);
                if (r < 0)
                        return log_error_errno(r,
                                               "Failed to read the domain's journal from etcd "
                                               "(%s): %s",
                                               domain_journal_prefix(s->domain),
                                               etcd_error(domain_etcd(s->domain)));
                broker_attach_journal(s->broker, j, s->config->journal_compact_bytes);
                log_info("Replayed the domain's journal from etcd: %" PRIu64 " records, %" PRIu64
                         " bytes",
                         st.records, st.bytes);
                return 0;
        }
        if (repair) {
                r = repair_copy_path(path, &copy);
                if (r < 0)
                        return log_error_errno(r, "Failed to name a copy of %s: %m", path);
        }
        r = journal_open_repair(path, copy, broker_apply, s->broker, &j, &st);
        if (r == -EBUSY)
                return log_error_errno(r, "Journal %s is held by another aquad", path);
        if (r == -EBADMSG)
                return log_error_errno(r,
                                       "%s is not an aqua journal (or a corrupt one); move it "
                                       "away to start afresh",
                                       path);
        if (r == -EUCLEAN)
                return log_error_errno(r,
                                       "Journal %s is damaged at byte %" PRIu64 ", before its "
                                       "end (intact records after it: %" PRIu64 "): not a torn "
                                       "write, and cutting it would lose acknowledged changes; "
                                       "not starting. `aquad -c %s --repair-journal` keeps a "
                                       "copy of it and cuts it at that byte",
                                       path, st.bad_offset, st.records_after, s->config_path);
        if (r < 0 && copy)
                return log_error_errno(r,
                                       "Failed to open or repair the journal %s (a repair first "
                                       "copies it to %s): %m",
                                       path, copy);
        if (r < 0)
                return log_error_errno(r, "Failed to open the journal %s: %m", path);
        broker_attach_journal(s->broker, j, s->config->journal_compact_bytes);
        if (st.bad_offset)
                log_warning("Journal %s was damaged at byte %" PRIu64 "; kept it as %s and cut it "
                            "there: dropped %" PRIu64 " bytes, the bad record and the intact "
                            "ones after it (%" PRIu64 "); leases only they knew come back to "
                            "their clients as lost when they re-register",
                            path, st.bad_offset, copy, st.dropped_bytes, st.records_after);
        else if (st.dropped_bytes)
                log_warning("Journal %s: cut off a torn tail of %" PRIu64 " bytes (a crash while "
                            "writing)",
                            path, st.dropped_bytes);
        else if (repair)
                log_notice("Journal %s is sound: nothing to repair", path);
        struct broker_counts n;

        broker_counts(s->broker, &n);
        if (n.chunks || n.leases)
                log_notice("Restored %zu chunks and %zu leases from %s; waiting %" PRIu64
                           " ms for clients to re-register",
                           n.chunks, n.leases, s->config->journal,
                           s->config->reconcile_timeout_ns / NSEC_PER_MSEC);
        return 0;
}
