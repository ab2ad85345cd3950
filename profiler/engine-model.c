/* The engine model: iteration-level continuous batching simulated in virtual time. */
#include "engine-model.h"

#include <errno.h>
#include <stdlib.h>

#include "time-util.h"
#include "util.h"

struct engine_model {
        struct target base;
        struct engine_params p;
};

static int engine_run(struct target *t, const struct load *load,
                      const volatile sig_atomic_t *cancel, struct run *ret_run)
{
        struct engine_model *m = (struct engine_model *)t;
        _cleanup_free_ size_t *running = NULL;
        size_t n_running = 0, arrived = 0, admitted = 0;
        uint64_t kv_used = 0; /* tokens reserved */
        uint64_t kv_cap = m->base.kv_capacity / m->p.kv_bytes_per_token;
        double now = 0;
        int r;

        r = run_init(ret_run, load->n, load->duration);
        if (r < 0)
                return r;
        running = calloc((size_t)m->p.max_batch, sizeof(*running));
        if (!running)
                return -ENOMEM;
        for (size_t i = 0; i < load->n; i++) {
                ret_run->samples[i].arrival = load->arrival[i];
                ret_run->samples[i].prompt_tokens = load->request[i]->prompt_tokens;
        }

        while (admitted < load->n || n_running > 0) {
                uint64_t prefill_tokens = 0;
                double cost;

                if (cancel && *cancel) {
                        ret_run->end = now;
                        return TARGET_E_CANCELLED;
                }
                if (n_running == 0 && admitted == arrived && now < load->arrival[admitted])
                        now = load->arrival[admitted];
                while (arrived < load->n && load->arrival[arrived] <= now)
                        arrived++;

                /* Admit in arrival order; the head of the queue blocks the rest, as in vLLM. */
                while (admitted < arrived && n_running < (size_t)m->p.max_batch) {
                        const struct request *q = load->request[admitted];
                        uint64_t ctx = (uint64_t)q->prompt_tokens + q->output_tokens;

                        if (ctx > kv_cap) {
                                ret_run->samples[admitted].error = -E2BIG;
                                ret_run->samples[admitted].finish = now;
                                run_note_error(ret_run, "a request's context exceeds the KV cache");
                                admitted++;
                                continue;
                        }
                        if (kv_used + ctx > kv_cap)
                                break;
                        kv_used += ctx;
                        prefill_tokens += q->prompt_tokens;
                        running[n_running++] = admitted++;
                }
                if (n_running == 0)
                        continue;

                cost = (double)(m->p.decode_base + m->p.decode_per_seq * n_running +
                                m->p.prefill_per_token * prefill_tokens) /
                       (double)NSEC_PER_SEC;
                now += cost;
                for (size_t k = 0; k < n_running;) {
                        size_t i = running[k];
                        struct sample *s = &ret_run->samples[i];
                        const struct request *q = load->request[i];

                        r = sample_add_token(s, now);
                        if (r < 0)
                                return r;
                        if (s->n_tokens >= q->output_tokens) {
                                s->finish = now;
                                kv_used -= (uint64_t)q->prompt_tokens + q->output_tokens;
                                running[k] = running[--n_running];
                        } else
                                k++;
                }
        }
        ret_run->end = MAX(now, load->duration);
        return 0;
}

static void engine_free(struct target *t)
{
        free(t);
}

static const struct target_ops engine_ops = {
        .name = "engine-model",
        .run = engine_run,
        .free = engine_free,
};

int engine_model_new(const struct engine_params *p, struct target **ret)
{
        struct engine_model *m;
        double usable;
        int64_t tp = p->tp > 0 ? p->tp : 1;

        if (p->max_batch < 1 || p->kv_bytes_per_token == 0 || p->memory_utilization <= 0 ||
            p->memory_utilization > 1)
                return -EINVAL;
        usable = (double)p->gpu_memory * (double)tp * p->memory_utilization;
        if (usable <= (double)p->weights + (double)p->kv_bytes_per_token)
                return -EINVAL;

        m = calloc(1, sizeof(*m));
        if (!m)
                return -ENOMEM;
        m->p = *p;
        m->p.tp = tp;
        m->base.ops = &engine_ops;
        m->base.kv_bytes_per_token = p->kv_bytes_per_token;
        m->base.kv_capacity = (uint64_t)(usable - (double)p->weights);
        *ret = &m->base;
        return 0;
}
