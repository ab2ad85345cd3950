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

/* In a domain of several hosts: which host a GPU is on, as a comment after its number. */
static void put_host_of(FILE *f, const struct place_kind *k, unsigned gpu)
{
        unsigned per_host = k->gpus / k->hosts;

        if (k->hosts > 1)
                fprintf(f, "   # host %u, GPU %u", gpu / per_host, gpu % per_host);
        fputc('\n', f);
}

/* One pair's two lines, indented by indent spaces. */
static void put_pair(FILE *f, const struct place_kind *k, const struct place_gpu_pair *pair,
                     int indent)
{
        fprintf(f, "%*s- producer: %u", indent, "", pair->producer);
        put_host_of(f, k, pair->producer);
        fprintf(f, "%*s  consumer: %u", indent, "", pair->consumer);
        put_host_of(f, k, pair->consumer);
}

int place_write_yaml(FILE *f, const struct place_problem *p, const struct place_result *r)
{
        const struct place_kind *kind;

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
                kind = &p->kinds[p->servers[r->server_of[i]].kind];
                if (kind->hosts > 1) {
                        unsigned per_host = kind->gpus / kind->hosts, last = UINT32_MAX;

                        /* A TP group's GPUs ascend, so its hosts do too. */
                        fprintf(f, "    hosts: [");
                        for (unsigned g = r->gpu_first[i]; g < r->gpu_first[i + 1]; g++)
                                if (r->gpu_list[g] / per_host != last) {
                                        fprintf(f, "%s%u", last == UINT32_MAX ? "" : ", ",
                                                r->gpu_list[g] / per_host);
                                        last = r->gpu_list[g] / per_host;
                                }
                        fprintf(f, "]\n");
                }
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
                kind = &p->kinds[p->servers[s].kind];
                if (kind->hosts > 1)
                        fprintf(f, "    hosts: %u\n    gpus-per-host: %u\n", kind->hosts,
                                kind->gpus / kind->hosts);
                if (r->pair_first[s] == r->pair_first[s + 1]) {
                        fprintf(f, "    pairs: []\n");
                        continue;
                }
                fprintf(f, "    pairs:\n");
                for (unsigned k = r->pair_first[s]; k < r->pair_first[s + 1]; k++)
                        put_pair(f, kind, &r->pairs[k], 6);
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
                put_pair(f, &p->kinds[p->servers[s].kind], &r->pairs[k], 2);
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
