/*
 * ZeroMQ CURVE keys as aqua keeps them: Z85 text (40 characters for 32 bytes), in key files
 * `aquactl keygen` writes: PATH holds "public-key: Z85" and "secret-key: Z85" lines (mode 0600),
 * PATH.pub the public line alone. Lines starting with '#' are comments.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#define CURVE_KEY_TEXT 40

/* Whether s is a Z85 CURVE key: 40 characters that decode to 32 bytes. */
bool curve_key_valid(const char *s);

/*
 * Read a key file: the public key into pub, the secret key into sec when sec is not NULL (then
 * the file must hold one). Returns 0, or a negative errno with err saying what is wrong with
 * which line of path.
 */
int curve_keyfile_load(const char *path, char pub[CURVE_KEY_TEXT + 1], char sec[CURVE_KEY_TEXT + 1],
                       char *err, size_t err_len);

/*
 * A public key given as Z85 text or as a key file's path (its public-key line): a file by that
 * name wins, since a path can be 40 characters of Z85 as well. Returns 0, or a negative errno
 * with err saying why.
 */
int curve_public_key_load(const char *key_or_path, char pub[CURVE_KEY_TEXT + 1], char *err,
                          size_t err_len);

/* A new key pair into path (0600, refusing to replace a file) and path.pub (0644). */
int curve_keyfile_write(const char *path, char pub[CURVE_KEY_TEXT + 1], char *err, size_t err_len);
