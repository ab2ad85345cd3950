/* The shared host link's model (hostlink.h). */
#include "hostlink.h"

void host_link_defaults(struct host_link *h)
{
        *h = (struct host_link){
            .gpu_gbps = 50,
            .gpus = 8,
            .gpus_per_switch = 2,
            .uplink_gbps = 50,
            .host_mem_gbps = 2 * 8 * 38.4,
        };
}

const char *host_link_limit_to_string(enum host_link_limit l)
{
        switch (l) {
        case HOST_LINK_GPU:
                return "its own PCIe link";
        case HOST_LINK_UPLINK:
                return "the PCIe switch's uplink";
        case HOST_LINK_MEMORY:
                return "host memory bandwidth";
        }
        return "?";
}

double host_link_share(const struct host_link *h, unsigned busy, enum host_link_limit *ret_limit)
{
        unsigned gpus = h->gpus ? h->gpus : 1;
        unsigned per_switch = h->gpus_per_switch ? h->gpus_per_switch : 1;
        if (per_switch > gpus)
                per_switch = gpus;
        if (busy < 1)
                busy = 1;
        if (busy > gpus)
                busy = gpus;
        unsigned switches = (gpus + per_switch - 1) / per_switch;
        /* Evenly spread: the busiest switch has ceil(busy / switches) of them. */
        unsigned on_switch = (busy + switches - 1) / switches;

        double share = h->gpu_gbps;
        enum host_link_limit limit = HOST_LINK_GPU;
        if (h->uplink_gbps / on_switch < share) {
                share = h->uplink_gbps / on_switch;
                limit = HOST_LINK_UPLINK;
        }
        if (h->host_mem_gbps / busy < share) {
                share = h->host_mem_gbps / busy;
                limit = HOST_LINK_MEMORY;
        }
        if (ret_limit)
                *ret_limit = limit;
        return share;
}
