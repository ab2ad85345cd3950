/*
 * The host link is shared: on an HGX-class server pairs of GPUs sit behind one PCIe switch, whose
 * uplink they share, and every GPU shares the host's memory bandwidth, while each NVLink pair is
 * private (aquad pairs one producer with one consumer). What one GPU swapping to DRAM gets when
 * `busy` GPUs swap at the same time.
 */
#pragma once

struct host_link {
        double gpu_gbps;          /* one GPU's own PCIe link, host DMA per direction */
        unsigned gpus;            /* GPUs in the server */
        unsigned gpus_per_switch; /* GPUs behind one PCIe switch */
        double uplink_gbps;       /* a switch's uplink to the host, per direction */
        double host_mem_gbps;     /* the host's memory bandwidth, all sockets */
};

/*
 * HGX H100: 8 GPUs, 2 behind each of 4 PCIe Gen5 switches; 50 GB/s host DMA per direction on a
 * GPU's x16 link (measured in the Aqua paper) and the same on a switch's x16 uplink; 2 sockets of
 * 8 DDR5-4800 channels (38.4 GB/s each): 614 GB/s.
 */
void host_link_defaults(struct host_link *h);

/* Which limit decides a GPU's share. */
enum host_link_limit {
        HOST_LINK_GPU,    /* its own link: nobody else in the way */
        HOST_LINK_UPLINK, /* the switch's uplink, shared with its neighbours */
        HOST_LINK_MEMORY, /* the host's memory bandwidth, shared by all */
};

const char *host_link_limit_to_string(enum host_link_limit l);

/*
 * GB/s per direction for one of `busy` GPUs (1..gpus; spread evenly over the switches) swapping at
 * once; *ret_limit (may be NULL) says which limit decided. busy out of range counts as its bound.
 */
double host_link_share(const struct host_link *h, unsigned busy, enum host_link_limit *ret_limit);
