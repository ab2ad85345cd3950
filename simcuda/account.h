/*
 * Machine-wide device memory accounting: every device allocation of every process of one simulated
 * machine is a file in one shared folder, alive exactly as long as the kernel keeps its memory.
 */
#pragma once

#include <stdint.h>

/* Open a private folder, creating it if needed: an O_DIRECTORY fd or a negative errno. */
int account_folder_open(const char *path);

/* Open (creating if needed) the folder of machine id; called once by cuInit. */
int account_open(const char *machine);

/*
 * Create the backing file of a size-byte allocation on device (SIM_HEADER_SIZE + size bytes,
 * header left zeroed), charging it against capacity. Returns a read-write fd whose open file
 * description holds the record alive; -ENOSPC when the device is full.
 */
int account_create(int device, uint64_t size, uint64_t capacity, int *ret_fd);

/* Bytes held on device by all processes of this machine; frees records nobody holds any more. */
int account_used(int device, uint64_t *ret_used);

/* Is anyone's open file description of the file name in folder dfd still alive (an OFD lock)? */
int account_file_alive(int dfd, const char *name);

/* The folder in use (for tests and diagnostics). */
const char *account_dir(void);
