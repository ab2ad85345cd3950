/*
 * Fuzz harness for the placer's input: the YAML loader (through the common schema loader), the
 * profiles it names, and the checks of place_problem_finish(). Profile paths resolve in a private
 * folder holding one good and one bad profile; inputs with '/' or '\' are skipped so that no path
 * (escaped or not) leaves it.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "place.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64];

static void cleanup(void)
{
        char path[96];

        snprintf(path, sizeof(path), "%s/p.yaml", dir);
        unlink(path);
        snprintf(path, sizeof(path), "%s/bad.yaml", dir);
        unlink(path);
        rmdir(dir);
}

static void write_file(const char *name, const char *text)
{
        char path[96];
        FILE *f;

        snprintf(path, sizeof(path), "%s/%s", dir, name);
        f = fopen(path, "we");
        if (!f || fputs(text, f) < 0 || fclose(f) != 0)
                abort();
}

static void setup(void)
{
        snprintf(dir, sizeof(dir), "/tmp/placer-fuzz-XXXXXX");
        if (!mkdtemp(dir))
                abort();
        write_file("p.yaml", "name: whisper\nrole: producer\nmemory: 20GiB\ntp: 2\n");
        write_file("bad.yaml", "role: lender\nmemory: lots\nextra: 1\n");
        atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct place_problem *p = NULL;
        char *error = NULL;
        int r;

        if (!dir[0])
                setup();
        if (memchr(data, '/', size) || memchr(data, '\\', size))
                return 0;
        r = place_problem_load_buffer("fuzz.yaml", data, size, dir, &p, &error);
        /* A refusal always says why, naming the input. */
        if (r != 0 && r != -ENOMEM && (!error || strncmp(error, "fuzz.yaml", 9) != 0)) {
                fprintf(stderr, "refused (%d) without naming the input: %s\n", r,
                        error ? error : "(no message)");
                abort();
        }
        if (r == 0 && (!p || error))
                abort();
        free(error);
        place_problem_free(p);
        return 0;
}
