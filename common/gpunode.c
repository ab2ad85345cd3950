/* GPU device nodes as evidence of who may use a GPU (gpunode.h). */
#include "gpunode.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "util.h"

#define NVIDIA_MAJOR 195

const char *gpunode_root(void)
{
        const char *r = getenv(GPUNODE_ROOT_ENV);

        return r && *r ? r : "/";
}

static void join(char *buf, size_t size, const char *root, const char *rest)
{
        size_t n = strlen(root);

        snprintf(buf, size, "%.*s/%s", (int)(n && root[n - 1] == '/' ? n - 1 : n), root, rest);
}

/* One information file: its uuid and minor; false when it has not both. */
static bool read_information(const char *path, char uuid[GPUNODE_UUID_LEN], unsigned *minor)
{
        char line[512];
        bool have_uuid = false, have_minor = false;
        FILE *f = fopen(path, "re");

        if (!f)
                return false;
        while (fgets(line, sizeof(line), f)) {
                char *colon = strchr(line, ':'), *v;

                if (!colon)
                        continue;
                *colon = '\0';
                for (v = colon + 1; isspace((unsigned char)*v); v++)
                        ;
                v[strcspn(v, " \t\r\n")] = '\0';
                if (strcmp(line, "GPU UUID") == 0 && strncmp(v, "GPU-", 4) == 0) {
                        snprintf(uuid, GPUNODE_UUID_LEN, "%s", v);
                        have_uuid = true;
                } else if (strcmp(line, "Device Minor") == 0 && isdigit((unsigned char)*v)) {
                        *minor = (unsigned)strtoul(v, NULL, 10);
                        have_minor = true;
                }
        }
        fclose(f);
        return have_uuid && have_minor;
}

/* Call fn for each GPU the driver under root lists, until it returns nonzero (returned). */
static int each_gpu(const char *root, int (*fn)(const char *uuid, unsigned minor, void *), void *u)
{
        char dir[PATH_MAX], path[PATH_MAX + 300], uuid[GPUNODE_UUID_LEN];
        struct dirent *e;
        unsigned minor = 0;
        int r = 0;
        DIR *d;

        join(dir, sizeof(dir), root, "proc/driver/nvidia/gpus");
        d = opendir(dir);
        if (!d)
                return 0;
        while (r == 0 && (e = readdir(d))) {
                if (e->d_name[0] == '.')
                        continue;
                snprintf(path, sizeof(path), "%s/%s/information", dir, e->d_name);
                if (read_information(path, uuid, &minor))
                        r = fn(uuid, minor, u);
        }
        closedir(d);
        return r;
}

struct find {
        const char *uuid;
        unsigned minor;
};

static int match_uuid(const char *uuid, unsigned minor, void *u)
{
        struct find *f = u;

        if (strcasecmp(uuid, f->uuid) != 0)
                return 0;
        f->minor = minor;
        return 1;
}

int gpunode_find(const char *root, const char *uuid, unsigned *ret_minor)
{
        struct find f = {.uuid = uuid};

        if (!uuid || each_gpu(root, match_uuid, &f) != 1)
                return -ENOENT;
        if (ret_minor)
                *ret_minor = f.minor;
        return 0;
}

static void node_path(char *buf, size_t size, const char *root, unsigned minor)
{
        char rest[32];

        snprintf(rest, sizeof(rest), "dev/nvidia%u", minor);
        join(buf, size, root, rest);
}

int gpunode_open(const char *root, const char *uuid)
{
        char path[PATH_MAX];
        unsigned minor;
        int fd;

        if (gpunode_find(root, uuid, &minor) < 0)
                return -ENOENT;
        node_path(path, sizeof(path), root, minor);
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        return fd < 0 ? -errno : fd;
}

struct by_fd {
        const char *root;
        struct stat st;
        char *uuid;
};

static int match_node(const char *uuid, unsigned minor, void *u)
{
        struct by_fd *b = u;
        char path[PATH_MAX];
        struct stat st;

        if (S_ISCHR(b->st.st_mode))
                return major(b->st.st_rdev) == NVIDIA_MAJOR && minor(b->st.st_rdev) == minor
                           ? (snprintf(b->uuid, GPUNODE_UUID_LEN, "%s", uuid), 1)
                           : 0;
        /* Simulated nodes (regular files under a test's root): the very file. */
        node_path(path, sizeof(path), b->root, minor);
        if (stat(path, &st) < 0 || !S_ISREG(st.st_mode) || st.st_dev != b->st.st_dev ||
            st.st_ino != b->st.st_ino)
                return 0;
        snprintf(b->uuid, GPUNODE_UUID_LEN, "%s", uuid);
        return 1;
}

int gpunode_uuid_of_fd(const char *root, int fd, char ret_uuid[GPUNODE_UUID_LEN])
{
        struct by_fd b = {.root = root, .uuid = ret_uuid};

        if (fstat(fd, &b.st) < 0)
                return -errno;
        if (!S_ISCHR(b.st.st_mode) && !S_ISREG(b.st.st_mode))
                return -ENOENT;
        return each_gpu(root, match_node, &b) == 1 ? 0 : -ENOENT;
}

/* mkdir -p of path's folders below root (which exists). */
static int make_dirs(char *path)
{
        for (char *p = strchr(path + 1, '/'); p; p = strchr(p + 1, '/')) {
                *p = '\0';
                if (mkdir(path, 0755) < 0 && errno != EEXIST) {
                        *p = '/';
                        return -errno;
                }
                *p = '/';
        }
        return 0;
}

int gpunode_publish(const char *root, unsigned minor, const char *uuid, const char *bus)
{
        char rest[128], path[PATH_MAX], tmp[PATH_MAX + 16];
        FILE *f;
        int fd, r;

        snprintf(rest, sizeof(rest), "proc/driver/nvidia/gpus/%s/information", bus);
        join(path, sizeof(path), root, rest);
        r = make_dirs(path);
        if (r < 0)
                return r;
        /* Written whole, then renamed: a reader never sees half of it. */
        snprintf(tmp, sizeof(tmp), "%s.%d", path, (int)getpid());
        f = fopen(tmp, "we");
        if (!f)
                return -errno;
        fprintf(f,
                "Model: \t\t simcuda GPU\nGPU UUID: \t %s\nBus Type: \t PCIe\n"
                "Bus Location: \t %s\nDevice Minor: \t %u\nGPU Excluded:\t No\n",
                uuid, bus, minor);
        if (fclose(f) != 0 || rename(tmp, path) < 0) {
                r = -errno;
                unlink(tmp);
                return r;
        }
        node_path(path, sizeof(path), root, minor);
        r = make_dirs(path);
        if (r < 0)
                return r;
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0)
                return errno == EEXIST ? 0 : -errno;
        /* The mode as asked, whatever the umask: a test narrows it as a host would. */
        r = fchmod(fd, 0666) < 0 ? -errno : 0;
        close(fd);
        return r;
}
