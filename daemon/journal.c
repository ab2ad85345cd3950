/* Journal file format: an 8-byte magic, then records of [u32 length][u32 crc32c][protobuf]. */
#include "journal.h"

#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>

#define MAGIC      "AQUAJNL1"
#define MAGIC_LEN  8
#define HEADER_LEN 8
/* A snapshot of the largest state the limits allow stays far below this. */
#define MAX_RECORD (256u << 20)

struct journal {
        char *path;
        int fd;
        uint64_t size;
        uint64_t base; /* size right after the last compaction (or open) */
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

static int write_all(int fd, const void *buf, size_t len)
{
        const char *p = buf;

        while (len > 0) {
                ssize_t n = write(fd, p, len);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                p += n;
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

static int replay(struct journal *j, journal_replay_fn fn, void *userdata,
                  struct journal_replay_stats *stats)
{
        uint64_t off = MAGIC_LEN, end;
        struct stat st;
        int r;

        if (fstat(j->fd, &st) < 0)
                return -errno;
        end = (uint64_t)st.st_size;
        while (off < end) {
                _cleanup_free_ uint8_t *buf = NULL;
                uint8_t header[HEADER_LEN];
                Aquaj__JournalRecord *rec;
                uint32_t len;

                r = read_at(j->fd, header, sizeof(header), off);
                if (r < 0)
                        return r;
                if (r > 0)
                        break;
                len = get_u32(header);
                if (len > MAX_RECORD || off + HEADER_LEN + len > end)
                        break;
                buf = malloc(len ? len : 1);
                if (!buf)
                        return -ENOMEM;
                r = read_at(j->fd, buf, len, off + HEADER_LEN);
                if (r < 0)
                        return r;
                if (r > 0 || crc32c(buf, len) != get_u32(header + 4))
                        break;
                rec = aquaj__journal_record__unpack(NULL, len, buf);
                if (!rec)
                        break;
                r = fn ? fn(rec, userdata) : 0;
                aquaj__journal_record__free_unpacked(rec, NULL);
                if (r < 0)
                        return r;
                off += HEADER_LEN + len;
                stats->records++;
        }
        stats->bytes = off - MAGIC_LEN;
        stats->dropped_bytes = end - off;
        /* Cut the tail so the next append follows the last intact record. */
        if (off < end && ftruncate(j->fd, (off_t)off) < 0)
                return -errno;
        j->size = off;
        return 0;
}

int journal_open(const char *path, journal_replay_fn fn, void *userdata, struct journal **ret,
                 struct journal_replay_stats *ret_stats)
{
        _cleanup_(journal_freep) struct journal *j = NULL;
        struct journal_replay_stats stats = {0};
        char magic[MAGIC_LEN];
        int r;

        j = calloc(1, sizeof(*j));
        if (!j)
                return -ENOMEM;
        j->fd = -1;
        j->path = strdup(path);
        if (!j->path)
                return -ENOMEM;
        r = make_parent(path);
        if (r < 0)
                return r;
        j->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
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
                r = fsync_parent(path);
                if (r < 0)
                        return r;
        } else if (memcmp(magic, MAGIC, MAGIC_LEN) != 0)
                return -EBADMSG;

        r = replay(j, fn, userdata, &stats);
        if (r < 0)
                return r;
        j->base = j->size;
        if (lseek(j->fd, 0, SEEK_END) < 0)
                return -errno;
        if (ret_stats)
                *ret_stats = stats;
        *ret = TAKE_PTR(j);
        return 0;
}

struct journal *journal_free(struct journal *j)
{
        if (!j)
                return NULL;
        safe_close(j->fd);
        free(j->path);
        free(j);
        return NULL;
}

int journal_append(struct journal *j, const Aquaj__JournalRecord *record)
{
        _cleanup_free_ uint8_t *buf = NULL;
        size_t len;
        int r;

        r = frame(record, &buf, &len);
        if (r < 0)
                return r;
        r = write_all(j->fd, buf, len);
        if (r < 0) {
                /* Leave no partial record behind for the next append to follow. */
                (void)!ftruncate(j->fd, (off_t)j->size);
                (void)!lseek(j->fd, 0, SEEK_END);
                return r;
        }
        if (fdatasync(j->fd) < 0) {
                r = -errno;
                /* Not known to be on disk: not a record the next append may follow. */
                (void)!ftruncate(j->fd, (off_t)j->size);
                (void)!lseek(j->fd, 0, SEEK_END);
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

        r = frame(snapshot, &buf, &len);
        if (r < 0)
                return r;
        if (asprintf(&tmp, "%s.new", j->path) < 0)
                return -ENOMEM;
        fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
                return -errno;
        r = write_all(fd, MAGIC, MAGIC_LEN);
        if (r >= 0)
                r = write_all(fd, buf, len);
        if (r >= 0 && fsync(fd) < 0)
                r = -errno;
        if (r >= 0 && flock(fd, LOCK_EX | LOCK_NB) < 0)
                r = -errno;
        if (r >= 0 && rename(tmp, j->path) < 0)
                r = -errno;
        if (r < 0) {
                unlink(tmp);
                return r;
        }
        r = fsync_parent(j->path);
        if (r < 0)
                return r;
        safe_close(j->fd);
        j->fd = TAKE_FD(fd);
        j->size = j->base = MAGIC_LEN + len;
        return 0;
}

uint64_t journal_size(const struct journal *j)
{
        return j->size;
}

bool journal_wants_compaction(const struct journal *j, uint64_t threshold)
{
        return j->size > threshold && j->size > 2 * j->base;
}
