/* Canned daemon replies for aquactl's formatting tests: two consumers, a producer, an offline GPU.
 */
#pragma once

#include "aqua.pb-c.h"

#define GIB (UINT64_C(1) << 30)
#define MIB (UINT64_C(1) << 20)

#define UUID0     "GPU-00000000-1111-2222-3333-444444444444"
#define UUID1     "GPU-11111111-1111-2222-3333-444444444444"
#define UUID2     "GPU-22222222-1111-2222-3333-444444444444"
#define UUID3     "GPU-33333333-1111-2222-3333-444444444444"
#define UUID_GONE "GPU-deadbeef-1111-2222-3333-444444444444"

struct canned {
        Aqua__AdminReply status, gpus, pairs, leases, chunks, events;
        Aqua__StatusInfo status_info;
        Aqua__GpuInfo gpu[4];
        Aqua__GpuInfo *gpu_list[4];
        Aqua__PairInfo pair[3];
        Aqua__PairInfo *pair_list[3];
        Aqua__LeaseInfo lease[3];
        Aqua__LeaseInfo *lease_list[3];
        Aqua__ChunkInfo chunk[3];
        Aqua__ChunkInfo *chunk_list[3];
        Aqua__EventInfo event[2];
        Aqua__EventInfo *event_list[2];
};

static inline void canned_init(struct canned *c)
{
        static const Aqua__AdminReply reply_init = AQUA__ADMIN_REPLY__INIT;
        static const Aqua__StatusInfo status_init = AQUA__STATUS_INFO__INIT;
        static const Aqua__GpuInfo gpu_init = AQUA__GPU_INFO__INIT;
        static const Aqua__PairInfo pair_init = AQUA__PAIR_INFO__INIT;
        static const Aqua__LeaseInfo lease_init = AQUA__LEASE_INFO__INIT;
        static const Aqua__ChunkInfo chunk_init = AQUA__CHUNK_INFO__INIT;
        static const Aqua__EventInfo event_init = AQUA__EVENT_INFO__INIT;

        c->status = c->gpus = c->pairs = c->leases = c->chunks = c->events = reply_init;

        c->status_info = status_init;
        c->status_info.daemon_version = 100;
        c->status_info.uptime_ms = (3 * 3600 + 12 * 60 + 5) * UINT64_C(1000);
        c->status_info.clients = 3;
        c->status_info.gpus = 4;
        c->status_info.pairs = 2;
        c->status_info.leases = 2;
        c->status_info.pool_bytes = 4 * GIB;
        c->status_info.lent_bytes = 3 * GIB;
        c->status_info.dram_budget = 64 * GIB;
        c->status_info.dram_granted = 2 * GIB + 512 * MIB;
        c->status_info.deadline_misses = 1;
        c->status_info.leases_lost = 1;
        c->status.status = &c->status_info;

        for (int i = 0; i < 4; i++) {
                c->gpu[i] = gpu_init;
                c->gpu[i].ordinal = (uint32_t)i;
                c->gpu[i].capacity = 80 * GIB;
                c->gpu_list[i] = &c->gpu[i];
        }
        c->gpu[0].uuid = UUID0;
        c->gpu[0].role = AQUA__ROLE__ROLE_CONSUMER;
        c->gpu[0].client_id = 11;
        c->gpu[0].client_name = "vllm-llama3";
        c->gpu[0].pid = 4242;
        c->gpu[0].load = 0.82;
        c->gpu[0].borrowed_bytes = 3 * GIB;
        c->gpu[0].dram_bytes = 512 * MIB;
        c->gpu[0].paired_with = UUID1;
        c->gpu[0].user = "alice";
        c->gpu[0].tenant = "team-a";
        c->gpu[1].uuid = UUID1;
        c->gpu[1].role = AQUA__ROLE__ROLE_PRODUCER;
        c->gpu[1].client_id = 12;
        c->gpu[1].client_name = "whisper";
        c->gpu[1].pid = 4343;
        c->gpu[1].load = 0.1;
        c->gpu[1].offered_bytes = 4 * GIB;
        c->gpu[1].lent_bytes = 3 * GIB;
        c->gpu[1].paired_with = UUID0;
        c->gpu[1].user = "root";
        c->gpu[1].tenant = "user:0";
        c->gpu[1].lends_to_all = true;
        c->gpu[2].uuid = UUID2;
        c->gpu[2].role = AQUA__ROLE__ROLE_CONSUMER;
        c->gpu[2].client_id = 13;
        c->gpu[2].client_name = "vllm-mistral";
        c->gpu[2].pid = 4444;
        c->gpu[2].load = 0.5;
        c->gpu[2].dram_bytes = 2 * GIB;
        c->gpu[2].barred = true;
        c->gpu[2].user = "bob";
        c->gpu[2].tenant = "user:1002";
        c->gpu[3].uuid = UUID3;
        c->gpu[3].role = AQUA__ROLE__ROLE_NEUTRAL;
        c->gpus.n_gpus = 4;
        c->gpus.gpus = c->gpu_list;

        for (int i = 0; i < 3; i++) {
                c->pair[i] = pair_init;
                c->pair_list[i] = &c->pair[i];
        }
        c->pair[0].producer_uuid = UUID1;
        c->pair[0].consumer_uuid = UUID0;
        c->pair[0].source = "config";
        c->pair[0].bandwidth_gbps = 450;
        c->pair[1].producer_uuid = UUID_GONE;
        c->pair[1].consumer_uuid = UUID2;
        c->pair[1].source = "auto";
        /* A pin that cannot stand: two tenants. */
        c->pair[2].producer_uuid = UUID3;
        c->pair[2].consumer_uuid = UUID2;
        c->pair[2].source = "config";
        c->pair[2].refused = "GPU-33333333 lends as user:1001 and GPU-22222222 borrows as "
                             "user:1002: tenants never share memory";
        c->pairs.n_pairs = 3;
        c->pairs.pairs = c->pair_list;

        for (int i = 0; i < 3; i++) {
                c->lease[i] = lease_init;
                c->lease_list[i] = &c->lease[i];
        }
        c->lease[0].lease_id = 7;
        c->lease[0].producer_uuid = UUID1;
        c->lease[0].consumer_uuid = UUID0;
        c->lease[0].state = "granted";
        c->lease[0].bytes = 2 * GIB;
        c->lease[0].chunks = 1024;
        c->lease[0].age_ms = 192000;
        c->lease[1].lease_id = 9;
        c->lease[1].producer_uuid = UUID1;
        c->lease[1].consumer_uuid = UUID0;
        c->lease[1].state = "reclaiming";
        c->lease[1].bytes = 1 * GIB;
        c->lease[1].chunks = 512;
        c->lease[1].age_ms = 5000;
        c->lease[1].deadline_ms = 1500;
        c->lease[2].lease_id = 3;
        c->lease[2].producer_uuid = UUID_GONE;
        c->lease[2].consumer_uuid = UUID2;
        c->lease[2].state = "lost";
        c->lease[2].bytes = 2 * MIB;
        c->lease[2].chunks = 1;
        c->lease[2].age_ms = 2 * 86400000 + 3 * 3600000;
        c->leases.n_leases = 3;
        c->leases.leases = c->lease_list;

        for (int i = 0; i < 3; i++) {
                c->chunk[i] = chunk_init;
                c->chunk[i].chunk_id = (uint64_t)i + 1;
                c->chunk[i].producer_uuid = UUID1;
                c->chunk[i].size = 2 * MIB;
                c->chunk_list[i] = &c->chunk[i];
        }
        c->chunk[0].state = "free";
        c->chunk[1].state = "leased";
        c->chunk[1].lease_id = 7;
        c->chunk[2].state = "reclaiming";
        c->chunk[2].lease_id = 9;
        c->chunks.n_chunks = 3;
        c->chunks.chunks = c->chunk_list;

        for (int i = 0; i < 2; i++) {
                c->event[i] = event_init;
                c->event_list[i] = &c->event[i];
        }
        c->event[0].time_ms = UINT64_C(1796000000000); /* 2026-11-30 00:53:20 UTC */
        c->event[0].kind = "lease";
        c->event[0].text = "lease 7: 2 GiB from GPU 1 to GPU 0";
        c->event[1].time_ms = UINT64_C(1796000061000);
        c->event[1].kind = "deadline-miss";
        c->event[1].text = "GPU 2 missed the reclaim deadline of lease 3";
        c->events.n_events = 2;
        c->events.events = c->event_list;
}
