/* GPU device nodes as evidence (gpunode.h): the driver's files as simcuda writes them. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpunode.h"

#define UUID0 "GPU-00112233-4455-6677-8899-aabbccddeeff"
#define UUID1 "GPU-ffeeddcc-bbaa-9988-7766-554433221100"

static char root[64];

static void setup(void)
{
        snprintf(root, sizeof(root), "/tmp/test-gpunode-XXXXXX");
        cr_assert_not_null(mkdtemp(root));
        cr_assert_eq(gpunode_publish(root, 0, UUID0, "0000:10:00.0"), 0);
        cr_assert_eq(gpunode_publish(root, 1, UUID1, "0000:11:00.0"), 0);
}

static void teardown(void)
{
        char cmd[128];

        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
        cr_assert_eq(system(cmd), 0);
}

TestSuite(gpunode, .init = setup, .fini = teardown);

Test(gpunode, finds_each_gpu_by_uuid_and_its_node_by_descriptor)
{
        char uuid[GPUNODE_UUID_LEN];
        unsigned minor = 9;
        int fd;

        cr_assert_eq(gpunode_find(root, UUID1, &minor), 0);
        cr_assert_eq(minor, 1);
        cr_assert_eq(gpunode_find(root, "GPU-00112233-4455-6677-8899-AABBCCDDEEFF", &minor), 0,
                     "uuids compare without case");
        cr_assert_eq(minor, 0);
        cr_assert_eq(gpunode_find(root, "GPU-0", NULL), -ENOENT);
        fd = gpunode_open(root, UUID1);
        cr_assert_geq(fd, 0);
        cr_assert_eq(gpunode_uuid_of_fd(root, fd, uuid), 0);
        cr_assert_str_eq(uuid, UUID1);
        close(fd);
}

Test(gpunode, a_descriptor_of_anything_else_is_no_gpus)
{
        char uuid[GPUNODE_UUID_LEN], path[128];
        int fd;

        fd = open("/dev/null", O_RDONLY);
        cr_assert_eq(gpunode_uuid_of_fd(root, fd, uuid), -ENOENT, "a character device of another "
                                                                   "major");
        close(fd);
        /* A copy of a node is another file: not the node. */
        snprintf(path, sizeof(path), "%s/copy", root);
        fd = open(path, O_RDWR | O_CREAT, 0600);
        cr_assert_eq(gpunode_uuid_of_fd(root, fd, uuid), -ENOENT);
        close(fd);
}

Test(gpunode, a_host_without_the_driver_lists_no_gpu)
{
        cr_assert_eq(gpunode_find("/nonexistent", UUID0, NULL), -ENOENT);
        cr_assert_eq(gpunode_open("/nonexistent", UUID0), -ENOENT);
}

Test(gpunode, publishing_again_keeps_a_node_a_host_narrowed)
{
        char path[128];
        struct stat st;

        snprintf(path, sizeof(path), "%s/dev/nvidia1", root);
        cr_assert_eq(chmod(path, 0600), 0);
        cr_assert_eq(gpunode_publish(root, 1, UUID1, "0000:11:00.0"), 0);
        cr_assert_eq(stat(path, &st), 0);
        cr_assert_eq(st.st_mode & 0777, 0600);
}
