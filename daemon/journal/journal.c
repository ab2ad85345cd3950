/*
 * The journal file: an 8-byte magic, then records of [u32 length][u32 crc32c][protobuf]; how it
 * is appended, compacted and replayed, and how a torn tail is told from damage before it.
 */
#include "journal.h"
#include "journal-etcd.h"

#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define MAGIC      "AQUAJNL1"
#define MAGIC_LEN  8
#define HEADER_LEN 8
/* A snapshot of the largest state the limits allow stays far below this. */
#define MAX_RECORD (256u << 20)
/*
 * Bytes checksummed while looking for intact records after a bad one. Past it the search stops
 * and the bad record counts as damage: refusing to start costs an operator a command, cutting
 * off acknowledged records costs leases.
 */
#define SEARCH_BUDGET (UINT64_C(256) << 20)

struct journal {
        char *path;
        int dfd;    /* its folder: every file of the journal is opened relative to it */
        char *name; /* its name in that folder */
        int fd;
        uint64_t size;
        uint64_t base; /* size right after the last compaction (or open) */
        struct etcd_journal *etcd; /* a domain's: records in etcd, no file */
};

static uint32_t crc32c(const void *data, size_t len)
{
        static uint32_t table[256];
        const uint8_t *p = data;
        uint32_t crc = ~0u;

        if (!table[1])
                for (uint32_t i = 0; i < 256; i++) {
                        uint32_t c = i;
                        for (int k = 0; k < 8; k++)
                                c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
                        table[i] = c;
                }
        while (len--)
                crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
        return ~crc;
}

static void put_u32(uint8_t *p, uint32_t v)
{
        p[0] = v & 0xff;
        p[1] = (v >> 8) & 0xff;
        p[2] = (v >> 16) & 0xff;
        p[3] = v >> 24;
}

static uint32_t get_u32(const uint8_t *p)
{
        return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int write_at(int fd, const void *buf, size_t len, uint64_t off)
{
        const char *p = buf;

        while (len > 0) {
                ssize_t n = pwrite(fd, p, len, (off_t)off);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                p += n;
                off += (uint64_t)n;
                len -= (size_t)n;
        }
        return 0;
}

/* Read exactly len bytes at off; 1 when the file ends first. */
static int read_at(int fd, void *buf, size_t len, uint64_t off)
{
        char *p = buf;

        while (len > 0) {
                ssize_t n = pread(fd, p, len, (off_t)off);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        return 1;
                p += n;
                off += (uint64_t)n;
                len -= (size_t)n;
        }
        return 0;
}

static int fsync_parent(const char *path)
{
        _cleanup_free_ char *copy = strdup(path);
        _cleanup_close_ int dfd = -1;

        if (!copy)
                return -ENOMEM;
        dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return -errno;
        return fsync(dfd) < 0 ? -errno : 0;
}

/* The folder of path, opened, and path's name in it. */
static int open_parent(const char *path, int *ret_dfd, char **ret_name)
{
        _cleanup_free_ char *dir = strdup(path), *base = strdup(path);
        int fd;

        if (!dir || !base)
                return -ENOMEM;
        fd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        *ret_name = strdup(basename(base));
        if (!*ret_name) {
                close(fd);
                return -ENOMEM;
        }
        *ret_dfd = fd;
        return 0;
}

static int make_parent(const char *path)
{
        _cleanup_free_ char *copy = strdup(path);

        if (!copy)
                return -ENOMEM;
        if (mkdir(dirname(copy), 0700) < 0 && errno != EEXIST)
                return -errno;
        return 0;
}

/* Encode record as one framed blob. */
static int frame(const Aquaj__JournalRecord *record, uint8_t **ret, size_t *ret_len)
{
        size_t len = aquaj__journal_record__get_packed_size(record);
        uint8_t *buf;

        if (len > MAX_RECORD)
                return -E2BIG;
        buf = malloc(HEADER_LEN + len);
        if (!buf)
                return -ENOMEM;
        aquaj__journal_record__pack(record, buf + HEADER_LEN);
        put_u32(buf, (uint32_t)len);
        put_u32(buf + 4, crc32c(buf + HEADER_LEN, len));
        *ret = buf;
        *ret_len = HEADER_LEN + len;
        return 0;
}

/* The journal file mapped for replay; nothing is mapped for a file of only its magic. */
struct mapping {
        const uint8_t *data;
        uint64_t size;
};

static void mapping_done(struct mapping *m)
{
        if (m->size)
                munmap((void *)m->data, m->size);
}

/*
 * The length of the record whose header is at off when its body fits in the file, else 0. No
 * record of length 0 is ever written (an empty batch is not appended): zeros, which is what a
 * power loss may leave where the file grew, frame nothing.
 */
static uint32_t framed_len(const struct mapping *m, uint64_t off)
{
        uint32_t len;

        if (m->size - off < HEADER_LEN)
                return 0;
        len = get_u32(m->data + off);
        if (len == 0 || len > MAX_RECORD || len > m->size - off - HEADER_LEN)
                return 0;
        return len;
}

static bool checksum_ok(const struct mapping *m, uint64_t off, uint32_t len)
{
        return crc32c(m->data + off + HEADER_LEN, len) == get_u32(m->data + off + 4);
}

/*
 * Whether intact records follow the bad one at bad, which makes it damage rather than a torn
 * tail. Each append is fsync'd before the next one, so a crash can only have damaged the bytes
 * from the start of the last record to the end of the file: an intact record anywhere after bad
 * proves the damage happened to a record written whole. Its length field may be the damaged
 * part, so every offset after it is tried, not just the one it names. *ret_after is the number
 * of intact records from the first one found on (0 when the search ran out of budget, which
 * also answers true).
 */
static bool intact_after(const struct mapping *m, uint64_t bad, uint64_t *ret_after)
{
        uint64_t budget = SEARCH_BUDGET, off, n = 0;
        uint32_t len = 0;

        for (off = bad + 1; off + HEADER_LEN < m->size; off++) {
                len = framed_len(m, off);
                if (!len)
                        continue;
                if (len > budget) {
                        *ret_after = 0;
                        return true;
                }
                budget -= len;
                if (checksum_ok(m, off, len))
                        break;
                len = 0;
        }
        if (!len)
                return false;
        do {
                n++;
                off += HEADER_LEN + len;
                len = framed_len(m, off);
        } while (len && checksum_ok(m, off, len));
        *ret_after = n;
        return true;
}

/* Keep the damaged file at copy_path, on disk before the journal loses anything. */
static int keep_copy(const struct mapping *m, const char *copy_path)
{
        _cleanup_close_ int fd = -1;
        int r;

        fd = open(copy_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0)
                return -errno;
        r = write_at(fd, m->data, m->size, 0);
        if (r >= 0 && fsync(fd) < 0)
                r = -errno;
        if (r < 0) {
                unlink(copy_path);
                return r;
        }
        return fsync_parent(copy_path);
}

/* Replay every intact record; on damage before the tail, refuse or (with copy_path) repair. */
static int replay(struct journal *j, const char *copy_path, journal_replay_fn fn, void *userdata,
                  struct journal_replay_stats *stats)
{
        _cleanup_(mapping_done) struct mapping m = {0};
        uint64_t off = MAGIC_LEN;
        bool damaged = false;
        struct stat st;
        int r;

        if (fstat(j->fd, &st) < 0)
                return -errno;
        if ((uint64_t)st.st_size > MAGIC_LEN) {
                void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, j->fd, 0);
                if (p == MAP_FAILED)
                        return -errno;
                m.data = p;
                m.size = (uint64_t)st.st_size;
        }
        while (off < m.size) {
                uint32_t len = framed_len(&m, off);
                Aquaj__JournalRecord *rec;

                if (!len || !checksum_ok(&m, off, len)) {
                        damaged = intact_after(&m, off, &stats->records_after);
                        break;
                }
                rec = aquaj__journal_record__unpack(NULL, len, m.data + off + HEADER_LEN);
                if (!rec) {
                        /* Written whole, as its checksum says: no crash makes this. */
                        damaged = true;
                        (void)intact_after(&m, off, &stats->records_after);
                        break;
                }
                r = fn ? fn(rec, userdata) : 0;
                aquaj__journal_record__free_unpacked(rec, NULL);
                if (r < 0)
                        return r;
                off += HEADER_LEN + len;
                stats->records++;
        }
        stats->bytes = off - MAGIC_LEN;
        if (damaged) {
                stats->bad_offset = off;
                if (!copy_path)
                        return -EUCLEAN;
                r = keep_copy(&m, copy_path);
                if (r < 0)
                        return r;
        }
        /* Cut the tail so the next append follows the last intact record. */
        if (off < m.size) {
                stats->dropped_bytes = m.size - off;
                if (ftruncate(j->fd, (off_t)off) < 0 || (damaged && fsync(j->fd) < 0))
                        return -errno;
        }
        j->size = off;
        return 0;
}

int journal_open_repair(const char *path, const char *copy_path, journal_replay_fn fn,
                        void *userdata, struct journal **ret,
                        struct journal_replay_stats *ret_stats)
{
        _cleanup_(journal_freep) struct journal *j = NULL;
        struct journal_replay_stats stats = {0};
        char magic[MAGIC_LEN];
        int r;

        j = calloc(1, sizeof(*j));
        if (!j)
                return -ENOMEM;
        j->fd = j->dfd = -1;
        j->path = strdup(path);
        if (!j->path)
                return -ENOMEM;
        r = make_parent(path);
        if (r < 0)
                return r;
        r = open_parent(path, &j->dfd, &j->name);
        if (r < 0)
                return r;
        /* Never through a link: the folder is aquad's (config_check_paths), and so is the file. */
        j->fd = openat(j->dfd, j->name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (j->fd < 0)
                return -errno;
        if (flock(j->fd, LOCK_EX | LOCK_NB) < 0)
                return errno == EWOULDBLOCK ? -EBUSY : -errno;

        r = read_at(j->fd, magic, MAGIC_LEN, 0);
        if (r < 0)
                return r;
        if (r > 0) {
                /* New or shorter than its magic (a crash during creation): start it afresh. */
                if (ftruncate(j->fd, 0) < 0 || pwrite(j->fd, MAGIC, MAGIC_LEN, 0) != MAGIC_LEN ||
                    fsync(j->fd) < 0)
                        return -errno;
                if (fsync(j->dfd) < 0)
                        return -errno;
        } else if (memcmp(magic, MAGIC, MAGIC_LEN) != 0)
                return -EBADMSG;

        r = replay(j, copy_path, fn, userdata, &stats);
        if (ret_stats && (r >= 0 || r == -EUCLEAN))
                *ret_stats = stats;
        if (r < 0)
                return r;
        j->base = j->size;
        *ret = TAKE_PTR(j);
        return 0;
}

int journal_open(const char *path, journal_replay_fn fn, void *userdata, struct journal **ret,
                 struct journal_replay_stats *ret_stats)
{
        return journal_open_repair(path, NULL, fn, userdata, ret, ret_stats);
}

int journal_open_etcd(struct etcd *e, const char *root, const struct journal_fence *fence,
                      journal_replay_fn fn, void *userdata, struct journal **ret,
                      struct journal_replay_stats *ret_stats)
{
        struct journal_replay_stats stats = {0};
        struct journal *j;
        int r;

        j = calloc(1, sizeof(*j));
        if (!j)
                return -ENOMEM;
        j->fd = j->dfd = -1;
        r = etcd_journal_open(e, root, fence, fn, userdata, &j->etcd, &stats);
        if (ret_stats)
                *ret_stats = stats;
        if (r < 0) {
                free(j);
                return r;
        }
        j->size = j->base = stats.bytes;
        *ret = j;
        return 0;
}

struct journal *journal_free(struct journal *j)
{
        if (!j)
                return NULL;
        etcd_journal_free(j->etcd);
        safe_close(j->fd);
        safe_close(j->dfd);
        free(j->path);
        free(j->name);
        free(j);
        return NULL;
}

int journal_append(struct journal *j, const Aquaj__JournalRecord *record)
{
        _cleanup_free_ uint8_t *buf = NULL;
        size_t len;
        int r;

        if (j->etcd)
                return etcd_journal_append(j->etcd, record);
        r = frame(record, &buf, &len);
        if (r < 0)
                return r;
        /* At the end of the intact records, not the file's end: should a partial record that
         * failed to write also fail to be cut, the next append overwrites it rather than follows
         * it, which would leave damage before the tail. */
        r = write_at(j->fd, buf, len, j->size);
        if (r < 0) {
                (void)!ftruncate(j->fd, (off_t)j->size);
                return r;
        }
        if (fdatasync(j->fd) < 0) {
                r = -errno;
                /* Not known to be on disk: not a record the next append may follow. */
                (void)!ftruncate(j->fd, (off_t)j->size);
                return r;
        }
        j->size += len;
        return 0;
}

int journal_compact(struct journal *j, const Aquaj__JournalRecord *snapshot)
{
        _cleanup_free_ char *tmp = NULL;
        _cleanup_free_ uint8_t *buf = NULL;
        _cleanup_close_ int fd = -1;
        size_t len;
        int r;

        /* A domain's state in etcd is objects already; etcd compacts its own history. */
        if (j->etcd)
                return 0;
        r = frame(snapshot, &buf, &len);
        if (r < 0)
                return r;
        if (asprintf(&tmp, "%s.new", j->name) < 0)
                return -ENOMEM;
        /* A file left by a compaction that died is ours (the folder is): made anew, never
         * followed or truncated in place. */
        if (unlinkat(j->dfd, tmp, 0) < 0 && errno != ENOENT)
                return -errno;
        fd = openat(j->dfd, tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0)
                return -errno;
        r = write_at(fd, MAGIC, MAGIC_LEN, 0);
        if (r >= 0)
                r = write_at(fd, buf, len, MAGIC_LEN);
        if (r >= 0 && fsync(fd) < 0)
                r = -errno;
        if (r >= 0 && flock(fd, LOCK_EX | LOCK_NB) < 0)
                r = -errno;
        if (r >= 0 && renameat(j->dfd, tmp, j->dfd, j->name) < 0)
                r = -errno;
        if (r < 0) {
                unlinkat(j->dfd, tmp, 0);
                return r;
        }
        if (fsync(j->dfd) < 0)
                return -errno;
        safe_close(j->fd);
        j->fd = TAKE_FD(fd);
        j->size = j->base = MAGIC_LEN + len;
        return 0;
}

uint64_t journal_size(const struct journal *j)
{
        return j->etcd ? etcd_journal_size(j->etcd) : j->size;
}

bool journal_wants_compaction(const struct journal *j, uint64_t threshold)
{
        return !j->etcd && j->size > threshold && j->size > 2 * j->base;
}

const char *journal_error(const struct journal *j)
{
        return j->etcd ? etcd_journal_error(j->etcd) : "";
}
