/* Ownership and mode checks of folders aquad serves from, and of the aquad a client reaches. */
#include "trust.h"

#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

const char *trust_user_name(uid_t uid, char *buf, size_t size)
{
        struct passwd pw, *found = NULL;
        char scratch[1024];

        if (getpwuid_r(uid, &pw, scratch, sizeof(scratch), &found) == 0 && found)
                snprintf(buf, size, "%s", found->pw_name);
        else
                snprintf(buf, size, "%u", (unsigned)uid);
        return buf;
}

static bool env_user(uid_t uid)
{
        const char *v = getenv(TRUST_DAEMON_USER_ENV);
        struct passwd pw, *found = NULL;
        char scratch[1024], *end;
        unsigned long n;

        if (!v || !*v)
                return false;
        errno = 0;
        n = strtoul(v, &end, 10);
        if (!*end && errno == 0)
                return n == (unsigned long)uid;
        return getpwnam_r(v, &pw, scratch, sizeof(scratch), &found) == 0 && found &&
               found->pw_uid == uid;
}

bool trust_daemon_uid(uid_t uid)
{
        return uid == 0 || uid == getuid() || uid == geteuid() || env_user(uid);
}

static int refuse(const char *dir, const struct stat *st, const char *what, char *why, size_t size)
{
        char name[64];

        snprintf(why, size, "%s is owned by %s with mode %04o: %s", dir,
                 trust_user_name(st->st_uid, name, sizeof(name)), (unsigned)(st->st_mode & 07777),
                 what);
        return -EPERM;
}

int trust_dir(const char *dir, uid_t owner, char *why, size_t size)
{
        char real[PATH_MAX], *slash;
        struct stat st;
        bool first = true;

        if (!realpath(dir, real)) {
                int r = -errno;
                snprintf(why, size, "%s: %s", dir, strerror(-r));
                return r;
        }
        /* From the folder itself up to /. */
        for (;;) {
                if (lstat(real, &st) < 0) {
                        int r = -errno;
                        snprintf(why, size, "%s: %s", real, strerror(-r));
                        return r;
                }
                if (!S_ISDIR(st.st_mode)) {
                        snprintf(why, size, "%s is not a folder", real);
                        return -ENOTDIR;
                }
                if (st.st_uid != 0 && st.st_uid != owner)
                        return refuse(real, &st,
                                      first ? "its owner could replace what aquad keeps there"
                                            : "its owner could move the folders below it",
                                      why, size);
                if (first && (st.st_mode & (S_IWGRP | S_IWOTH)))
                        return refuse(real, &st, "others may write in it", why, size);
                if (!first && (st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
                        return refuse(real, &st,
                                      "others may write in it without the sticky bit, and so move "
                                      "the folders below it",
                                      why, size);
                first = false;
                if (strcmp(real, "/") == 0)
                        return 0;
                slash = strrchr(real, '/');
                if (slash == real)
                        slash[1] = '\0';
                else
                        *slash = '\0';
        }
}

int trust_parent(const char *path, uid_t owner, char *why, size_t size)
{
        _cleanup_free_ char *dir = strdup(path);
        char *slash;

        if (!dir) {
                snprintf(why, size, "out of memory");
                return -ENOMEM;
        }
        slash = strrchr(dir, '/');
        if (!slash)
                return trust_dir(".", owner, why, size);
        if (slash == dir)
                slash[1] = '\0';
        else
                *slash = '\0';
        return trust_dir(dir, owner, why, size);
}

/* The folder of path passes trust_dir() for uid, the user that serves the socket at path. */
static int trust_socket_folder(const char *path, uid_t uid, char *why, size_t size)
{
        char inner[PATH_MAX + 128];
        int r = trust_parent(path, uid, inner, sizeof(inner));

        if (r < 0)
                snprintf(why, size, "aquad's socket %s: %s", path, inner);
        return r < 0 ? -EPERM : 0;
}

int trust_server(int fd, const char *side_path, const char *ipc_path, char *why, size_t size)
{
        struct ucred cred;
        socklen_t len = sizeof(cred);
        struct stat st;
        char name[64];
        int r;

        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
                r = -errno;
                snprintf(why, size, "cannot tell who serves %s: %s", side_path, strerror(-r));
                return r;
        }
        if (!trust_daemon_uid(cred.uid)) {
                snprintf(why, size,
                         "%s is served by %s (uid %u, pid %d), not by root or this user: refusing "
                         "to speak to it (set " TRUST_DAEMON_USER_ENV " to the user aquad runs as "
                         "if that is it)",
                         side_path, trust_user_name(cred.uid, name, sizeof(name)),
                         (unsigned)cred.uid, (int)cred.pid);
                return -EPERM;
        }
        r = trust_socket_folder(side_path, cred.uid, why, size);
        if (r < 0 || !ipc_path)
                return r;
        if (lstat(ipc_path, &st) < 0) {
                r = -errno;
                snprintf(why, size, "aquad's endpoint ipc://%s: %s", ipc_path, strerror(-r));
                return r;
        }
        if (!S_ISSOCK(st.st_mode) || st.st_uid != cred.uid) {
                snprintf(why, size,
                         "aquad's endpoint ipc://%s is %s of %s, not the socket of the user that "
                         "serves %s (%s): refusing to speak to it",
                         ipc_path, S_ISSOCK(st.st_mode) ? "a socket" : "a file",
                         trust_user_name(st.st_uid, name, sizeof(name)), side_path,
                         trust_user_name(cred.uid, (char[64]){0}, 64));
                return -EPERM;
        }
        return trust_socket_folder(ipc_path, cred.uid, why, size);
}
