/* Prints aqua.h's structure layouts and constants as JSON, for test_library.py to compare with
 * the package's ctypes declarations. */
#include <stddef.h>
#include <stdio.h>

#include "aqua/aqua.h"

static int first = 1;

static void open_struct(const char *name, size_t size)
{
        printf("%s\"%s\": {\"size\": %zu, \"fields\": {", first ? "" : ", ", name, size);
        first = 0;
}

#define S(t) open_struct(#t, sizeof(struct t))
#define F(t, f, sep) printf("%s\"%s\": %zu", sep, #f, offsetof(struct t, f))
#define END() printf("}}")
#define C(name, sep) printf("%s\"%s\": %lld", sep, #name, (long long)(name))

int main(void)
{
        printf("{\"structs\": {");
        S(aqua_options); F(aqua_options, size, ""); F(aqua_options, endpoint, ", ");
        F(aqua_options, side_path, ", "); F(aqua_options, client_name, ", ");
        F(aqua_options, timeout_ms, ", "); F(aqua_options, chunk_bytes, ", ");
        F(aqua_options, server_key, ", "); F(aqua_options, public_key, ", ");
        F(aqua_options, secret_key, ", "); END();
        S(aqua_info); F(aqua_info, device, ""); F(aqua_info, role, ", ");
        F(aqua_info, gpu_uuid, ", "); F(aqua_info, paired_with, ", ");
        F(aqua_info, capacity, ", "); F(aqua_info, granularity, ", ");
        F(aqua_info, chunk_bytes, ", "); F(aqua_info, client_id, ", ");
        F(aqua_info, connected, ", "); F(aqua_info, dram_budget, ", ");
        F(aqua_info, reclaim_deadline_ms, ", "); F(aqua_info, offered_bytes, ", ");
        F(aqua_info, borrowed_bytes, ", "); F(aqua_info, dram_bytes, ", ");
        F(aqua_info, tensor_peer_bytes, ", "); F(aqua_info, tensor_local_bytes, ", ");
        F(aqua_info, tensor_dram_bytes, ", "); F(aqua_info, pool_free_bytes, ", ");
        F(aqua_info, dram_granted, ", "); END();
        S(aqua_grant); F(aqua_grant, lease, ""); F(aqua_grant, dptr, ", ");
        F(aqua_grant, bytes, ", "); F(aqua_grant, dram_bytes, ", ");
        F(aqua_grant, partial, ", "); END();
        S(aqua_lease_info); F(aqua_lease_info, lease_id, ""); F(aqua_lease_info, dptr, ", ");
        F(aqua_lease_info, bytes, ", "); F(aqua_lease_info, peer_bytes, ", ");
        F(aqua_lease_info, dram_bytes, ", "); F(aqua_lease_info, n_chunks, ", ");
        F(aqua_lease_info, chunk_bytes, ", "); END();
        S(aqua_chunk_info); F(aqua_chunk_info, chunk_id, ""); F(aqua_chunk_info, offset, ", ");
        F(aqua_chunk_info, bytes, ", "); F(aqua_chunk_info, tier, ", ");
        F(aqua_chunk_info, host, ", "); END();
        S(aqua_load); F(aqua_load, load, ""); F(aqua_load, used_bytes, ", ");
        F(aqua_load, free_bytes, ", "); END();
        S(aqua_event); F(aqua_event, type, ""); F(aqua_event, lease, ", ");
        F(aqua_event, offset, ", "); F(aqua_event, bytes, ", "); F(aqua_event, error, ", ");
        F(aqua_event, tensor, ", "); F(aqua_event, tier, ", "); F(aqua_event, host, ", ");
        END();
        S(aqua_tensor_options); F(aqua_tensor_options, size, "");
        F(aqua_tensor_options, chunk_bytes, ", "); F(aqua_tensor_options, tier, ", ");
        F(aqua_tensor_options, flags, ", "); END();
        S(aqua_tensor_info); F(aqua_tensor_info, dptr, ""); F(aqua_tensor_info, max_bytes, ", ");
        F(aqua_tensor_info, chunk_bytes, ", "); F(aqua_tensor_info, begin, ", ");
        F(aqua_tensor_info, end, ", "); F(aqua_tensor_info, peer_bytes, ", ");
        F(aqua_tensor_info, local_bytes, ", "); F(aqua_tensor_info, dram_bytes, ", "); END();
        S(aqua_tensor_range); F(aqua_tensor_range, offset, "");
        F(aqua_tensor_range, bytes, ", "); F(aqua_tensor_range, tier, ", ");
        F(aqua_tensor_range, host, ", "); END();
        S(aqua_copy_piece); F(aqua_copy_piece, dst, ""); F(aqua_copy_piece, src, ", ");
        F(aqua_copy_piece, bytes, ", "); END();
        printf("}, \"constants\": {");
        C(AQUA_VERSION_MAJOR, ""); C(AQUA_VERSION_MINOR, ", ");
        C(AQUA_PENDING, ", "); C(AQUA_TIMEOUT, ", "); C(AQUA_NO_MEMORY, ", ");
        C(AQUA_BARRED, ", "); C(AQUA_LIMIT, ", "); C(AQUA_THROTTLED, ", ");
        C(AQUA_DRAINING, ", "); C(AQUA_JOURNAL, ", ");
        C(AQUA_ROLE_PRODUCER, ", "); C(AQUA_ROLE_CONSUMER, ", "); C(AQUA_ROLE_NEUTRAL, ", ");
        C(AQUA_TIER_NONE, ", "); C(AQUA_TIER_PEER, ", "); C(AQUA_TIER_DRAM, ", ");
        C(AQUA_TIER_LOCAL, ", "); C(AQUA_LOG_ERROR, ", "); C(AQUA_LOG_WARNING, ", ");
        C(AQUA_LOG_NOTICE, ", "); C(AQUA_LOG_INFO, ", "); C(AQUA_LOG_DEBUG, ", ");
        C(AQUA_EVENT_RECLAIMED, ", "); C(AQUA_EVENT_MIGRATED, ", ");
        C(AQUA_EVENT_RECLAIM_FAILED, ", "); C(AQUA_EVENT_LEASE_LOST, ", ");
        C(AQUA_EVENT_PAIR_CHANGED, ", "); C(AQUA_EVENT_DAEMON_STOPPING, ", ");
        C(AQUA_EVENT_TENSOR_MIGRATED, ", "); C(AQUA_EVENT_DISCONNECTED, ", ");
        C(AQUA_EVENT_RECONNECTED, ", "); C(AQUA_BORROW_ALLOW_DRAM, ", ");
        C(AQUA_BORROW_TENSORS, ", "); C(AQUA_TENSOR_ALLOW_LOCAL, ", ");
        C(AQUA_TENSOR_RECLAIM_LOCAL, ", ");
        printf("}}\n");
        return 0;
}
