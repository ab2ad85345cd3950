/*
 * Fabric handles (CU_MEM_HANDLE_TYPE_FABRIC) between simulated hosts. Every machine naming the same
 * AQUA_SIM_FABRIC shares one folder, the fabric; exporting an allocation links its backing file
 * there under a random name, and the 64-byte handle carries that name. Importers open the file by
 * name and hold an OFD read lock on it, which keeps the exporter machine's accounting record
 * alive for as long as any importer still holds or maps the memory. Sharing needs an IMEX channel
 * (AQUA_SIM_IMEX_CHANNEL), the same for exporter and importer, as the real driver requires.
 */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "account.h"
#include "sim.h"

#define FABRIC_MAGIC "SIMFAB01"

/* The handle's layout; the rest of the 64 bytes is zero. */
struct fabric_handle {
        char magic[8];
        uint32_t channel;
        int32_t loc_id;
        uint64_t size;
        uint8_t id[16];
};
_Static_assert(sizeof(struct fabric_handle) <= sizeof(CUmemFabricHandle), "fits 64 bytes");

static pthread_mutex_t fabric_lock = PTHREAD_MUTEX_INITIALIZER;
static int fabric_fd = -1;

int fabric_open(void)
{
        const char *base = getenv("AQUA_SIM_RUNTIME_DIR");
        char path[PATH_MAX];
        int fd;

        if (!sim.fabric[0])
                return 0;
        if (!base || !*base)
                base = "/dev/shm";
        if ((size_t)snprintf(path, sizeof(path), "%s/aqua-sim-%u-fabric-%s", base,
                             (unsigned)getuid(), sim.fabric) >= sizeof(path))
                return -ENAMETOOLONG;
        fd = account_folder_open(path);
        if (fd < 0)
                return fd;
        pthread_mutex_lock(&fabric_lock);
        safe_close(fabric_fd);
        fabric_fd = fd;
        pthread_mutex_unlock(&fabric_lock);
        return 0;
}

static void entry_name(const uint8_t id[16], char ret[40])
{
        char *p = ret;

        p += sprintf(p, "f-");
        for (int i = 0; i < 16; i++)
                p += sprintf(p, "%02x", id[i]);
}

/* Unlink entries of memory nobody holds any more (no OFD lock on the file). */
static void sweep_locked(void)
{
        _cleanup_close_ int fd = dup(fabric_fd);
        struct dirent *de;
        DIR *d;

        if (fd < 0)
                return;
        d = fdopendir(fd);
        if (!d)
                return;
        TAKE_FD(fd);
        /* The dup shares the folder's offset with every earlier sweep. */
        rewinddir(d);
        while ((de = readdir(d)))
                if (strncmp(de->d_name, "f-", 2) == 0 &&
                    account_file_alive(fabric_fd, de->d_name) == 0)
                        (void)unlinkat(fabric_fd, de->d_name, 0);
        closedir(d);
}

CUresult sim_fabric_export(int fd, int loc_id, uint64_t size, CUmemFabricHandle *ret)
{
        struct fabric_handle h = {.loc_id = loc_id, .size = size};
        char proc[64], name[40];
        int r;

        if (!sim.fabric[0])
                return CUDA_ERROR_NOT_SUPPORTED;
        if (sim.imex_channel < 0)
                return CUDA_ERROR_NOT_PERMITTED;
        memcpy(h.magic, FABRIC_MAGIC, sizeof(h.magic));
        h.channel = (uint32_t)sim.imex_channel;
        if (getrandom(h.id, sizeof(h.id), 0) != (ssize_t)sizeof(h.id))
                return CUDA_ERROR_OPERATING_SYSTEM;
        entry_name(h.id, name);
        snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
        pthread_mutex_lock(&fabric_lock);
        sweep_locked();
        /* A hard link: the same memory, reachable by name from every host of the fabric. */
        r = linkat(AT_FDCWD, proc, fabric_fd, name, AT_SYMLINK_FOLLOW);
        pthread_mutex_unlock(&fabric_lock);
        if (r < 0)
                return CUDA_ERROR_OPERATING_SYSTEM;
        memset(ret, 0, sizeof(*ret));
        memcpy(ret->data, &h, sizeof(h));
        return CUDA_SUCCESS;
}

CUresult sim_fabric_import(const CUmemFabricHandle *handle, int *ret_fd, int *ret_loc_id,
                           uint64_t *ret_size)
{
        struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
        static const uint8_t zero[sizeof(CUmemFabricHandle) - sizeof(struct fabric_handle)];
        _cleanup_close_ int fd = -1;
        struct fabric_handle h;
        char name[40];
        struct stat st;

        if (!sim.fabric[0])
                return CUDA_ERROR_NOT_SUPPORTED;
        if (sim.imex_channel < 0)
                return CUDA_ERROR_NOT_PERMITTED;
        memcpy(&h, handle->data, sizeof(h));
        if (memcmp(h.magic, FABRIC_MAGIC, sizeof(h.magic)) != 0 ||
            memcmp(handle->data + sizeof(h), zero, sizeof(zero)) != 0)
                return CUDA_ERROR_INVALID_VALUE;
        if (h.channel != (uint32_t)sim.imex_channel)
                return CUDA_ERROR_NOT_PERMITTED;
        entry_name(h.id, name);
        pthread_mutex_lock(&fabric_lock);
        /* Memory nobody holds is gone, even while its entry waits for a sweep. */
        if (account_file_alive(fabric_fd, name) == 1)
                fd = openat(fabric_fd, name, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        /* Taken before the fabric lock drops, so no sweep sees the memory unheld. */
        if (fd >= 0 && fcntl(fd, F_OFD_SETLK, &fl) < 0)
                fd = safe_close(fd);
        pthread_mutex_unlock(&fabric_lock);
        /* Memory that is gone (or never was) is not a shareable handle. */
        if (fd < 0 || fstat(fd, &st) < 0 || (uint64_t)st.st_size != SIM_HEADER_SIZE + h.size)
                return CUDA_ERROR_INVALID_VALUE;
        *ret_fd = TAKE_FD(fd);
        *ret_loc_id = h.loc_id;
        *ret_size = h.size;
        return CUDA_SUCCESS;
}
