/* Writing a placement: the full YAML, and one pairs file per server that aquad loads. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "place.h"

/* A YAML double-quoted scalar: names come from the input and may hold anything. */
static void put_str(FILE *f, const char *s)
{
        fputc('"', f);
        for (; *s; s++) {
                unsigned char c = (unsigned char)*s;

                if (c == '"' || c == '\\')
                        fprintf(f, "\\%c", c);
                else if (c < 0x20 || c == 0x7f)
                        fprintf(f, "\\x%02x", c);
                else
                        fputc(c, f);
        }
        fputc('"', f);
}

static void put_gib(FILE *f, int64_t mib)
{
        fprintf(f, "%.10g", (double)mib / 1024.0);
}

int place_write_yaml(FILE *f, const struct place_problem *p, const struct place_result *r)
{
        if (!f || !p || !r)
                return -EINVAL;
        fprintf(f, "# Placement of %u models on %u servers, written by aqua-place.\n",
                p->n_models, p->n_servers);
        fprintf(f, "solver: %s\n", place_solver_names[r->solver]);
        fprintf(f, "status: %s\n", place_status_names[r->status]);
        fprintf(f, "objective: %.10g\n", r->objective);
        fprintf(f, "bound: %.10g\n", r->bound);
        fprintf(f, "gap: %.6g\n", r->gap);
        fprintf(f, "seconds: %.3f\n", r->seconds);
        if (r->solver == PLACE_SOLVER_EXACT)
                fprintf(f, "configurations: %zu   # %s\n", r->configurations,
                        r->generated ? "generated as columns" : "enumerated");
        fprintf(f, "weights:\n  memory: %.10g\n  balance: %.10g\n", p->w_memory, p->w_balance);
        fprintf(f, "max-memory-imbalance-gib: ");
        put_gib(f, r->max_memory);
        fprintf(f, "\nmax-role-imbalance: %d\n", r->max_balance);
        fprintf(f, "split-tp-groups: %u\n", r->n_split_tp);

        fprintf(f, "assignments:\n");
        for (unsigned i = 0; i < p->n_models; i++) {
                fprintf(f, "  - model: ");
                put_str(f, p->models[i].name);
                fprintf(f, "\n    role: %s\n    server: ", place_role_names[p->models[i].role]);
                put_str(f, p->servers[r->server_of[i]].name);
                fprintf(f, "\n    gpus: [");
                for (unsigned g = r->gpu_first[i]; g < r->gpu_first[i + 1]; g++)
                        fprintf(f, "%s%u", g > r->gpu_first[i] ? ", " : "", r->gpu_list[g]);
                fprintf(f, "]\n");
        }

        fprintf(f, "servers:\n");
        for (unsigned s = 0; s < p->n_servers; s++) {
                fprintf(f, "  - name: ");
                put_str(f, p->servers[s].name);
                fprintf(f, "\n    kind: ");
                put_str(f, p->kinds[p->servers[s].kind].name);
                fprintf(f, "\n    memory-balance-gib: ");
                put_gib(f, r->memory[s]);
                fprintf(f, "\n    role-balance: %d\n", r->balance[s]);
                if (r->pair_first[s] == r->pair_first[s + 1]) {
                        fprintf(f, "    pairs: []\n");
                        continue;
                }
                fprintf(f, "    pairs:\n");
                for (unsigned k = r->pair_first[s]; k < r->pair_first[s + 1]; k++)
                        fprintf(f, "      - producer: %u\n        consumer: %u\n",
                                r->pairs[k].producer, r->pairs[k].consumer);
        }
        fflush(f);
        return ferror(f) ? -EIO : 0;
}

/* Write via a temporary name and rename, so aquad never reads half a file. */
static int write_one(int dirfd, const struct place_problem *p, const struct place_result *r,
                     unsigned s)
{
        const char *name = p->servers[s].name;
        _cleanup_free_ char *tmp = NULL, *final = NULL;
        FILE *f;
        int fd, e = 0;

        if (asprintf(&tmp, ".%s.yaml.tmp", name) < 0 || asprintf(&final, "%s.yaml", name) < 0)
                return -ENOMEM;
        fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0)
                return -errno;
        f = fdopen(fd, "w");
        if (!f) {
                e = -errno;
                close(fd);
                unlinkat(dirfd, tmp, 0);
                return e;
        }
        fprintf(f, "# Producer/consumer GPU pairs for server ");
        put_str(f, name);
        fprintf(f, ", written by aqua-place (%s, %s).\n", place_solver_names[r->solver],
                place_status_names[r->status]);
        if (r->pair_first[s] == r->pair_first[s + 1])
                fprintf(f, "pairs: []\n");
        else
                fprintf(f, "pairs:\n");
        for (unsigned k = r->pair_first[s]; k < r->pair_first[s + 1]; k++)
                fprintf(f, "  - producer: %u\n    consumer: %u\n", r->pairs[k].producer,
                        r->pairs[k].consumer);
        if (fflush(f) != 0 || ferror(f))
                e = -EIO;
        if (fclose(f) != 0 && e == 0)
                e = -errno;
        if (e == 0 && renameat(dirfd, tmp, dirfd, final) < 0)
                e = -errno;
        if (e < 0)
                unlinkat(dirfd, tmp, 0);
        return e;
}

int place_write_pairs(const char *dir, const struct place_problem *p,
                      const struct place_result *r, char **ret_error)
{
        _cleanup_close_ int dirfd = -1;

        if (!dir || !p || !r)
                return -EINVAL;
        for (unsigned s = 0; s < p->n_servers; s++) {
                const char *n = p->servers[s].name;
                if (!n[0] || n[0] == '.' || strchr(n, '/'))
                        return place_error(ret_error, -EINVAL,
                                    "server name '%s' cannot be a file name in %s", n, dir);
        }
        dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dirfd < 0)
                return place_error(ret_error, -errno, "%s: %s", dir, strerror(errno));
        for (unsigned s = 0; s < p->n_servers; s++) {
                int e = write_one(dirfd, p, r, s);
                if (e < 0)
                        return place_error(ret_error, e, "%s/%s.yaml: %s", dir, p->servers[s].name,
                                    strerror(-e));
        }
        return 0;
}
