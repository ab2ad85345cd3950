/*
 * The paths a config names, checked before aquad binds or writes anything: sockets that are
 * sockets (or nothing yet), lock files that hold a pid, folders only aquad's user or root may
 * write ("Who may hold what", daemon/README.md).
 */
#include "config.h"

#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "trust.h"

static int path_error(char **ret, const char *fmt, ...) _printf_(2, 3);
static int path_error(char **ret, const char *fmt, ...)
{
        va_list ap;
        int n;

        va_start(ap, fmt);
        n = vasprintf(ret, fmt, ap);
        va_end(ap);
        if (n < 0)
                *ret = NULL;
        return -EINVAL;
}

/* What kind of file st is, for an error naming it. */
static const char *file_kind(const struct stat *st)
{
        return S_ISREG(st->st_mode)    ? "regular file"
               : S_ISDIR(st->st_mode)  ? "directory"
               : S_ISLNK(st->st_mode)  ? "symbolic link"
               : S_ISFIFO(st->st_mode) ? "FIFO"
                                       : "device or other file";
}

/* A socket path aquad will bind: absent, or a socket (one a dead aquad left, replaced). */
static int check_socket_path(const char *what, const char *path, const char *journal,
                             char **ret_error)
{
        _cleanup_free_ char *lock = NULL;
        _cleanup_close_ int fd = -1;
        struct stat st;
        char buf[32] = {0}; /* a NUL after what pread() reads, for strspn() */
        ssize_t n;

        if (journal && strcmp(path, journal) == 0)
                return path_error(ret_error, "%s %s is also the journal; give them two files", what,
                                  path);
        if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode))
                return path_error(ret_error,
                                  "%s %s is a %s, not a socket: aquad replaces only a socket an "
                                  "aquad left there; remove it or name another path",
                                  what, path, file_kind(&st));
        /* Its lock holds an aquad's pid or nothing: anything else is someone's file. */
        if (asprintf(&lock, "%s.lock", path) < 0)
                return -ENOMEM;
        if (journal && strcmp(lock, journal) == 0)
                return path_error(ret_error,
                                  "%s %s: its lock file %s is the journal; name another path", what,
                                  path, lock);
        if (lstat(lock, &st) < 0)
                return 0;
        if (!S_ISREG(st.st_mode))
                return path_error(ret_error, "%s %s: its lock file %s is a %s; remove it", what,
                                  path, lock, file_kind(&st));
        if (st.st_uid != geteuid()) {
                char owner[64];
                return path_error(ret_error,
                                  "%s %s: its lock file %s belongs to %s, not to aquad's user; "
                                  "aquad takes only a lock it made (remove it)",
                                  what, path, lock,
                                  trust_user_name(st.st_uid, owner, sizeof(owner)));
        }
        fd = open(lock, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        n = fd >= 0 ? pread(fd, buf, sizeof(buf), 0) : 0;
        if (n < 0 || (size_t)n >= sizeof(buf) || strspn(buf, "0123456789\n") < (size_t)n)
                return path_error(ret_error,
                                  "%s %s: its lock file %s holds something other than an "
                                  "aquad's pid; remove it or name another path",
                                  what, path, lock);
        return 0;
}

/*
 * The folder that holds path (or, while aquad has yet to make it, the one above): aquad's own
 * user's or root's, and writable by no one else, as sshd's StrictModes asks of ~/.ssh. Anyone
 * else who could write there could rename aquad's sockets away and bind their own, or plant a
 * link where aquad writes its journal.
 */
static int check_folder(const char *what, const char *path, char **ret_error)
{
        _cleanup_free_ char *dir = strdup(path);
        char why[PATH_MAX + 128], *slash;
        int r;

        if (!dir)
                return -ENOMEM;
        r = trust_parent(path, geteuid(), why, sizeof(why));
        slash = strrchr(dir, '/');
        if (r == -ENOENT && slash && slash != dir) {
                *slash = '\0';
                r = trust_parent(dir, geteuid(), why, sizeof(why));
        }
        if (r == -EPERM)
                return path_error(ret_error,
                                  "%s %s: refusing its folder: %s; aquad serves and writes only "
                                  "in folders of its own user or root that no one else may write "
                                  "(such as /run/aqua, which systemd's RuntimeDirectory makes)",
                                  what, path, why);
        if (r < 0 && r != -ENOENT)
                return path_error(ret_error, "%s %s: %s", what, path, why);
        return 0;
}

int config_check_paths(const struct config *c, char **ret_error)
{
        int r;

        r = check_folder("side-socket", c->side_socket, ret_error);
        if (r == 0 && strncmp(c->endpoint, "ipc://", 6) == 0)
                r = check_folder("endpoint", c->endpoint + 6, ret_error);
        if (r == 0)
                r = check_folder("journal", c->journal, ret_error);
        if (r < 0)
                return r;
        r = check_socket_path("side-socket", c->side_socket, c->journal, ret_error);
        if (r < 0 || strncmp(c->endpoint, "ipc://", 6) != 0 ||
            strcmp(c->endpoint + 6, c->side_socket) == 0)
                return r;
        return check_socket_path("endpoint", c->endpoint + 6, c->journal, ret_error);
}
