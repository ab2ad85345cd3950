/* Request pools (ShareGPT JSON or synthetic) and arrival schedules for the load generator. */
#include "workload.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

const char *const length_dist_names[] = {"fixed", "uniform", "exponential", NULL};
const char *const arrival_kind_names[] = {"poisson", "uniform", "trace", NULL};

/* The largest dataset or trace file read; ShareGPT V3 is ~650 MB. */
#define WORKLOAD_MAX_FILE (2ull << 30)

void rng_seed(struct rng *r, uint64_t seed)
{
        r->state = seed;
}

uint64_t rng_next(struct rng *r)
{
        uint64_t z = (r->state += UINT64_C(0x9E3779B97F4A7C15));

        z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
        return z ^ (z >> 31);
}

double rng_uniform(struct rng *r)
{
        /* 53 random bits, shifted off zero so log() is always finite. */
        return ((double)(rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
}

static char *errorf(const char *fmt, ...) _printf_(1, 2);
static char *errorf(const char *fmt, ...)
{
        va_list ap;
        char *s = NULL;

        va_start(ap, fmt);
        if (vasprintf(&s, fmt, ap) < 0)
                s = NULL;
        va_end(ap);
        return s;
}

static int read_file(const char *path, char **ret_data, size_t *ret_size)
{
        _cleanup_free_ char *data = NULL;
        FILE *f;
        long size;

        f = fopen(path, "re");
        if (!f)
                return -errno;
        if (fseek(f, 0, SEEK_END) < 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) < 0) {
                int r = -errno;
                fclose(f);
                return r;
        }
        if ((unsigned long)size > WORKLOAD_MAX_FILE) {
                fclose(f);
                return -E2BIG;
        }
        data = malloc((size_t)size + 1);
        if (!data) {
                fclose(f);
                return -ENOMEM;
        }
        if (fread(data, 1, (size_t)size, f) != (size_t)size) {
                fclose(f);
                return -EIO;
        }
        fclose(f);
        data[size] = 0;
        *ret_data = TAKE_PTR(data);
        *ret_size = (size_t)size;
        return 0;
}

static uint32_t estimate_tokens(size_t chars)
{
        size_t t = chars / 4;

        return t < 1 ? 1 : t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
}

static void json_putp(json_object **j)
{
        if (*j)
                json_object_put(*j);
}

int request_pool_parse_sharegpt(const char *path, const char *data, size_t size,
                                size_t max_requests, struct request_pool *ret_pool,
                                char **ret_error)
{
        _cleanup_(json_putp) json_object *root = NULL;
        _cleanup_(request_pool_done) struct request_pool pool = {0};
        json_tokener *tok;
        size_t n;

        if (size > INT32_MAX)
                return -E2BIG;
        tok = json_tokener_new_ex(JSON_TOKENER_DEFAULT_DEPTH);
        if (!tok)
                return -ENOMEM;
        root = json_tokener_parse_ex(tok, data, (int)size);
        if (!root || json_tokener_get_error(tok) != json_tokener_success) {
                enum json_tokener_error e = json_tokener_get_error(tok);
                size_t at = json_tokener_get_parse_end(tok);

                json_tokener_free(tok);
                *ret_error = errorf("%s: malformed JSON at byte %zu: %s", path, at,
                                    e == json_tokener_continue ? "unexpected end of file"
                                                               : json_tokener_error_desc(e));
                return WORKLOAD_E_MALFORMED;
        }
        json_tokener_free(tok);

        if (!json_object_is_type(root, json_type_array)) {
                *ret_error = errorf("%s: expected a JSON array of conversations", path);
                return WORKLOAD_E_MALFORMED;
        }
        n = json_object_array_length(root);
        pool.requests = calloc(n ? n : 1, sizeof(*pool.requests));
        if (!pool.requests)
                return -ENOMEM;

        for (size_t i = 0; i < n && (max_requests == 0 || pool.n < max_requests); i++) {
                json_object *entry = json_object_array_get_idx(root, i), *conv, *h, *g, *v;
                struct request *req = &pool.requests[pool.n];

                if (!json_object_is_type(entry, json_type_object) ||
                    !json_object_object_get_ex(entry, "conversations", &conv) ||
                    !json_object_is_type(conv, json_type_array)) {
                        *ret_error = errorf("%s: entry %zu has no \"conversations\" list", path, i);
                        return WORKLOAD_E_MALFORMED;
                }
                if (json_object_array_length(conv) < 2)
                        continue;
                h = json_object_array_get_idx(conv, 0);
                g = json_object_array_get_idx(conv, 1);
                if (!json_object_is_type(h, json_type_object) ||
                    !json_object_is_type(g, json_type_object)) {
                        *ret_error = errorf("%s: entry %zu: turns must be objects", path, i);
                        return WORKLOAD_E_MALFORMED;
                }
                if (!json_object_object_get_ex(h, "value", &v) ||
                    !json_object_is_type(v, json_type_string)) {
                        *ret_error = errorf("%s: entry %zu: turn 0 has no string \"value\"", path, i);
                        return WORKLOAD_E_MALFORMED;
                }
                req->prompt = strdup(json_object_get_string(v));
                if (!req->prompt)
                        return -ENOMEM;
                req->prompt_tokens = estimate_tokens((size_t)json_object_get_string_len(v));
                if (!json_object_object_get_ex(g, "value", &v) ||
                    !json_object_is_type(v, json_type_string)) {
                        free(req->prompt);
                        req->prompt = NULL;
                        *ret_error = errorf("%s: entry %zu: turn 1 has no string \"value\"", path, i);
                        return WORKLOAD_E_MALFORMED;
                }
                req->output_tokens = estimate_tokens((size_t)json_object_get_string_len(v));
                pool.n++;
        }
        if (pool.n == 0) {
                *ret_error = errorf("%s: no conversation with at least two turns", path);
                return WORKLOAD_E_MALFORMED;
        }
        *ret_pool = pool;
        pool = (struct request_pool){0};
        return 0;
}

int request_pool_load_sharegpt(const char *path, size_t max_requests,
                               struct request_pool *ret_pool, char **ret_error)
{
        _cleanup_free_ char *data = NULL;
        size_t size;
        int r;

        r = read_file(path, &data, &size);
        if (r < 0)
                return r;
        return request_pool_parse_sharegpt(path, data, size, max_requests, ret_pool, ret_error);
}

static uint32_t draw_length(const struct length_spec *s, struct rng *rng)
{
        double v;

        switch (s->dist) {
        case LENGTH_UNIFORM:
                v = (double)s->min + floor(rng_uniform(rng) * (double)(s->max - s->min + 1));
                break;
        case LENGTH_EXPONENTIAL:
                v = round(-log(rng_uniform(rng)) * (double)s->mean);
                v = MAX(v, (double)s->min);
                v = MIN(v, (double)s->max);
                break;
        default:
                v = (double)s->mean;
        }
        return v < 1 ? 1 : v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

int request_pool_synthetic(const struct length_spec *prompt, const struct length_spec *output,
                           size_t n, uint64_t seed, struct request_pool *ret_pool)
{
        struct request_pool pool = {0};
        struct rng rng;

        if (n == 0)
                return -EINVAL;
        pool.requests = calloc(n, sizeof(*pool.requests));
        if (!pool.requests)
                return -ENOMEM;
        rng_seed(&rng, seed);
        for (size_t i = 0; i < n; i++) {
                pool.requests[i].prompt_tokens = draw_length(prompt, &rng);
                pool.requests[i].output_tokens = draw_length(output, &rng);
        }
        pool.n = n;
        *ret_pool = pool;
        return 0;
}

void request_pool_done(struct request_pool *pool)
{
        for (size_t i = 0; i < pool->n; i++)
                free(pool->requests[i].prompt);
        free(pool->requests);
        *pool = (struct request_pool){0};
}

int trace_load(const char *path, double **ret_times, size_t *ret_n, char **ret_error)
{
        _cleanup_free_ char *data = NULL;
        size_t size;
        int r;

        r = read_file(path, &data, &size);
        if (r < 0)
                return r;
        return trace_parse(path, data, ret_times, ret_n, ret_error);
}

int trace_parse(const char *path, char *data, double **ret_times, size_t *ret_n,
                char **ret_error)
{
        _cleanup_free_ double *times = NULL;
        size_t n = 0, cap = 0, line = 0;
        for (char *l = data, *next; l; l = next) {
                char *end;
                double t;

                next = strchr(l, '\n');
                if (next)
                        *next++ = 0;
                line++;
                l += strspn(l, " \t\r");
                if (*l == 0 || *l == '#')
                        continue;
                errno = 0;
                t = strtod(l, &end);
                end += strspn(end, " \t\r");
                if (errno || *end || !isfinite(t) || t < 0 || (n > 0 && t < times[n - 1])) {
                        *ret_error = errorf("%s:%zu: expected a non-negative arrival time in "
                                            "seconds, not before the previous one", path, line);
                        return WORKLOAD_E_MALFORMED;
                }
                if (n == cap) {
                        double *p = realloc(times, (cap = cap ? cap * 2 : 256) * sizeof(*p));
                        if (!p)
                                return -ENOMEM;
                        times = p;
                }
                times[n++] = t;
        }
        if (n < 2 || times[n - 1] <= times[0]) {
                *ret_error = errorf("%s: a trace needs at least two distinct arrival times", path);
                return WORKLOAD_E_MALFORMED;
        }
        *ret_times = TAKE_PTR(times);
        *ret_n = n;
        return 0;
}

/*
 * Arrivals are drawn in "operational time" where the rate is 1, then mapped to
 * wall time through the inverse of the cumulative rate, so bursts apply to every
 * arrival kind alike.
 */
static double operational_to_time(const struct load_spec *s, double u)
{
        double f = s->burst_factor > 0 ? s->burst_factor : 1;
        double before = s->rate * s->burst_start;  /* operational time at the burst start */
        double during = s->rate * f * s->burst_len; /* operational length of the burst */

        if (f == 1 || u <= before)
                return u / s->rate;
        if (u <= before + during)
                return s->burst_start + (u - before) / (s->rate * f);
        return s->burst_start + s->burst_len + (u - before - during) / s->rate;
}

int load_make(const struct load_spec *spec, const struct request_pool *pool, struct load *ret_load)
{
        _cleanup_(load_done) struct load load = {0};
        size_t cap = 0, ti = 1;
        double u = 0, trace_mean = 0;
        struct rng rng;

        if (spec->rate <= 0 || spec->duration <= 0 || pool->n == 0)
                return -EINVAL;
        if (spec->arrival == ARRIVAL_TRACE) {
                if (!spec->trace || spec->n_trace < 2)
                        return -EINVAL;
                trace_mean = (spec->trace[spec->n_trace - 1] - spec->trace[0]) /
                             (double)(spec->n_trace - 1);
        }
        rng_seed(&rng, spec->seed);
        load.duration = spec->duration;

        for (;;) {
                double t;

                switch (spec->arrival) {
                case ARRIVAL_UNIFORM:
                        u += 1;
                        break;
                case ARRIVAL_TRACE:
                        u += (spec->trace[ti] - spec->trace[ti - 1]) / trace_mean;
                        ti = ti + 1 < spec->n_trace ? ti + 1 : 1;
                        break;
                default:
                        u += -log(rng_uniform(&rng));
                }
                t = operational_to_time(spec, u);
                if (t >= spec->duration)
                        break;
                if (load.n == cap) {
                        size_t ncap = cap ? cap * 2 : 1024;
                        double *a = realloc(load.arrival, ncap * sizeof(*a));
                        if (!a)
                                return -ENOMEM;
                        load.arrival = a;
                        const struct request **q = realloc(load.request, ncap * sizeof(*q));
                        if (!q)
                                return -ENOMEM;
                        load.request = q;
                        cap = ncap;
                }
                load.arrival[load.n] = t;
                load.request[load.n] = &pool->requests[rng_next(&rng) % pool->n];
                load.n++;
        }
        *ret_load = load;
        load = (struct load){0};
        return 0;
}

void load_done(struct load *load)
{
        free(load->arrival);
        free(load->request);
        *load = (struct load){0};
}
