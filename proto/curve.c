/* CURVE key files: parsing, validation and `aquactl keygen`'s writing. */
#include "curve.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "util.h"

static void fclosep(FILE **f)
{
        if (*f)
                fclose(*f);
}

static int fail(int r, char *err, size_t err_len, const char *fmt, ...) _printf_(4, 5);
static int fail(int r, char *err, size_t err_len, const char *fmt, ...)
{
        va_list ap;

        if (err && err_len) {
                va_start(ap, fmt);
                vsnprintf(err, err_len, fmt, ap);
                va_end(ap);
        }
        return r;
}

bool curve_key_valid(const char *s)
{
        uint8_t raw[32];

        if (!s || strlen(s) != CURVE_KEY_TEXT)
                return false;
        return zmq_z85_decode(raw, s) != NULL;
}

static char *trim(char *s)
{
        size_t n;

        s += strspn(s, " \t");
        n = strlen(s);
        while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t'))
                s[--n] = '\0';
        /* A quoted value, as YAML would have it. */
        if (n >= 2 && (s[0] == '"' || s[0] == '\'') && s[n - 1] == s[0]) {
                s[n - 1] = '\0';
                s++;
        }
        return s;
}

int curve_keyfile_load(const char *path, char pub[CURVE_KEY_TEXT + 1], char sec[CURVE_KEY_TEXT + 1],
                       char *err, size_t err_len)
{
        _cleanup_(fclosep) FILE *f = NULL;
        char line[256];
        bool have_pub = false, have_sec = false;
        unsigned lineno = 0;
        struct stat st;

        f = fopen(path, "re");
        if (!f)
                return fail(-errno, err, err_len, "%s: %s", path, strerror(errno));
        if (fstat(fileno(f), &st) < 0)
                return fail(-errno, err, err_len, "%s: %s", path, strerror(errno));
        while (fgets(line, sizeof(line), f)) {
                char *key = trim(line), *colon, *value;
                char *dst;

                lineno++;
                if (!*key || *key == '#')
                        continue;
                colon = strchr(key, ':');
                if (!colon)
                        return fail(-EINVAL, err, err_len, "%s:%u: expected \"public-key: Z85\" or "
                                    "\"secret-key: Z85\"", path, lineno);
                *colon = '\0';
                value = trim(colon + 1);
                key = trim(key);
                if (strcmp(key, "public-key") == 0) {
                        dst = pub;
                        have_pub = true;
                } else if (strcmp(key, "secret-key") == 0) {
                        if (!sec)
                                continue; /* a pair file read for its public key */
                        dst = sec;
                        have_sec = true;
                } else
                        /* Never its text: a line that does not parse may be a pasted secret. */
                        return fail(-EINVAL, err, err_len,
                                    "%s:%u: expected \"public-key: Z85\" or \"secret-key: Z85\"",
                                    path, lineno);
                if (!curve_key_valid(value))
                        return fail(-EINVAL, err, err_len,
                                    "%s:%u: %s: not a Z85 CURVE key (40 characters of Z85)", path,
                                    lineno, key);
                memcpy(dst, value, CURVE_KEY_TEXT + 1);
        }
        if (!have_pub)
                return fail(-EINVAL, err, err_len, "%s: no public-key", path);
        if (sec && !have_sec)
                return fail(-EINVAL, err, err_len,
                            "%s: no secret-key (a .pub file holds only the public key)", path);
        /* A secret others may read is no secret, one they may write not ours (ssh refuses both). */
        if (sec && (st.st_mode & 0077))
                return fail(-EPERM, err, err_len,
                            "%s: a secret key %s by others (mode %04o); make it 0600 (chmod 600 "
                            "%s)",
                            path, st.st_mode & 0022 ? "writable" : "readable",
                            (unsigned)(st.st_mode & 07777), path);
        return 0;
}

static int write_file(const char *path, mode_t mode, const char *text, char *err, size_t err_len)
{
        _cleanup_close_ int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        size_t n = strlen(text);

        if (fd < 0)
                return fail(-errno, err, err_len, "%s: %s", path, strerror(errno));
        if (write(fd, text, n) != (ssize_t)n || fsync(fd) < 0)
                return fail(-errno, err, err_len, "%s: %s", path, strerror(errno));
        return 0;
}

int curve_public_key_load(const char *key_or_path, char pub[CURVE_KEY_TEXT + 1], char *err,
                          size_t err_len)
{
        /* A path may be 40 characters of Z85 too ("/tmp/..." is): a file by that name wins. */
        if (access(key_or_path, F_OK) == 0 || !curve_key_valid(key_or_path))
                return curve_keyfile_load(key_or_path, pub, NULL, err, err_len);
        memcpy(pub, key_or_path, CURVE_KEY_TEXT + 1);
        return 0;
}

int curve_keyfile_write(const char *path, char pub[CURVE_KEY_TEXT + 1], char *err, size_t err_len)
{
        char sec[CURVE_KEY_TEXT + 1], text[256];
        _cleanup_free_ char *pubpath = NULL;
        int r;

        if (zmq_curve_keypair(pub, sec) < 0)
                return fail(-errno, err, err_len, "cannot make a key pair: %s (libzmq without "
                            "CURVE?)", zmq_strerror(errno));
        if (asprintf(&pubpath, "%s.pub", path) < 0)
                return fail(-ENOMEM, err, err_len, "out of memory");
        snprintf(text, sizeof(text),
                 "# aqua CURVE key pair (Z85), from aquactl keygen: keep this file secret\n"
                 "public-key: %s\nsecret-key: %s\n",
                 pub, sec);
        r = write_file(path, 0600, text, err, err_len);
        explicit_bzero(text, sizeof(text));
        explicit_bzero(sec, sizeof(sec));
        if (r < 0)
                return r;
        snprintf(text, sizeof(text), "# aqua CURVE public key (Z85)\npublic-key: %s\n", pub);
        r = write_file(pubpath, 0644, text, err, err_len);
        if (r < 0)
                unlink(path);
        return r;
}
