/*
 * Whom a file or folder belongs to, and who else could change it, as sshd's StrictModes asks:
 * aquad serves and writes only in folders that are its own, and clients speak only to an aquad
 * run by a user they trust (daemon/README.md, "Who may hold what").
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The variable that names one more user (a name or a uid) a client trusts to run aquad. */
#define TRUST_DAEMON_USER_ENV "AQUA_DAEMON_USER"

/* Whether a client may speak to an aquad run by uid: root, its own user, or $AQUA_DAEMON_USER. */
bool trust_daemon_uid(uid_t uid);

/*
 * Whether only root or owner can change what dir holds: dir (its links resolved) and every
 * folder above it is owned by root or owner; dir is writable by no one else; a folder above it
 * that others may write keeps them from renaming what they do not own (the sticky bit, /tmp).
 * 0; -EPERM with why naming the folder, its owner and its mode; another negative errno with why.
 */
int trust_dir(const char *dir, uid_t owner, char *why, size_t size);

/* The same for the folder that holds path. */
int trust_parent(const char *path, uid_t owner, char *why, size_t size);

/* "root", a user's name, or its uid in decimal, into buf. */
const char *trust_user_name(uid_t uid, char *buf, size_t size);

/*
 * Whether a client may speak to the aquad on the other end of fd, a connected side channel at
 * side_path, whose ZeroMQ endpoint is ipc_path (NULL: not ipc://): the kernel's SO_PEERCRED for
 * fd and the owner of the ipc:// socket are users trust_daemon_uid() accepts, and both folders
 * pass trust_dir() for that user. 0, or -EPERM with why naming the uid or folder.
 */
int trust_server(int fd, const char *side_path, const char *ipc_path, char *why, size_t size);
