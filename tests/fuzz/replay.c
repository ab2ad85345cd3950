/*
 * main() for fuzz harnesses built without libFuzzer: feeds every file of the given corpus
 * folders (or files) to LLVMFuzzerTestOneInput once, so a kept corpus runs as a normal test.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
        FILE *f = fopen(path, "rbe");
        uint8_t *buf;
        long size;

        if (!f) {
                fprintf(stderr, "fuzz-replay: %s: %s\n", path, strerror(errno));
                return -1;
        }
        fseek(f, 0, SEEK_END);
        size = ftell(f);
        fseek(f, 0, SEEK_SET);
        buf = malloc(size > 0 ? (size_t)size : 1);
        if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) {
                fprintf(stderr, "fuzz-replay: %s: cannot read\n", path);
                free(buf);
                fclose(f);
                return -1;
        }
        fclose(f);
        LLVMFuzzerTestOneInput(buf, (size_t)size);
        free(buf);
        return 0;
}

int main(int argc, char **argv)
{
        unsigned files = 0;

        for (int i = 1; i < argc; i++) {
                struct stat st;
                DIR *d;
                struct dirent *de;

                if (stat(argv[i], &st) < 0) {
                        fprintf(stderr, "fuzz-replay: %s: %s\n", argv[i], strerror(errno));
                        return 1;
                }
                if (!S_ISDIR(st.st_mode)) {
                        if (replay_file(argv[i]) < 0)
                                return 1;
                        files++;
                        continue;
                }
                d = opendir(argv[i]);
                if (!d)
                        return 1;
                while ((de = readdir(d))) {
                        char path[4096];

                        if (de->d_name[0] == '.')
                                continue;
                        snprintf(path, sizeof(path), "%s/%s", argv[i], de->d_name);
                        if (replay_file(path) < 0) {
                                closedir(d);
                                return 1;
                        }
                        files++;
                }
                closedir(d);
        }
        if (files == 0) {
                fprintf(stderr, "fuzz-replay: no corpus files given\n");
                return 1;
        }
        printf("fuzz-replay: %u inputs replayed\n", files);
        return 0;
}
