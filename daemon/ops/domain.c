/* Leader election for a domain through an etcd lease (domain.h). */
#include "domain.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "etcd.h"
#include "log.h"
#include "time-util.h"

struct domain {
        struct etcd *etcd;
        char *name, *leader_key, *journal_prefix, *advertise;
        int64_t ttl_s, lease, term;
        bool leader;
        uint64_t renew_due_ns;   /* next renewal */
        uint64_t lease_until_ns; /* the lease holds at least until then, as this host counts */
        /* Tests only (AQUA_DOMAIN_TEST): "trust-fence": never step down of itself, so that only
         * the journal's fence stops a deposed leader; "no-fence": neither. */
        bool never_step_down, unfenced;
        char lost[256];
        uint64_t commits;
        double commit_seconds;
};

int domain_new(const struct config_domain *c, const char *endpoint, struct domain **ret)
{
        _cleanup_(domain_freep) struct domain *d = calloc(1, sizeof(*d));
        const char *test = getenv("AQUA_DOMAIN_TEST");
        struct etcd_options o = {
            .urls = c->etcd,
            .n_urls = c->n_etcd,
            .ca_file = c->etcd_ca_file,
            .cert_file = c->etcd_cert_file,
            .key_file = c->etcd_key_file,
            .user = c->etcd_user,
            .password = c->etcd_password,
            .timeout_ms = c->etcd_timeout_ns / NSEC_PER_MSEC,
        };
        int r;

        if (!d)
                return -ENOMEM;
        d->ttl_s = (int64_t)(c->lease_ttl_ns / NSEC_PER_SEC);
        if (asprintf(&d->leader_key, "/aqua/%s/leader", c->name) < 0 ||
            asprintf(&d->journal_prefix, "/aqua/%s/journal/", c->name) < 0 ||
            !(d->name = strdup(c->name)) ||
            !(d->advertise = strdup(c->advertise ? c->advertise : endpoint)))
                return -ENOMEM;
        r = etcd_new(&o, &d->etcd);
        if (r < 0)
                return r;
        if (test && strcmp(test, "trust-fence") == 0)
                d->never_step_down = true;
        if (test && strcmp(test, "no-fence") == 0)
                d->never_step_down = d->unfenced = true;
        if (d->never_step_down)
                log_warning("AQUA_DOMAIN_TEST=%s: this aquad %s (for tests only)", test,
                            d->unfenced ? "neither steps down nor fences its commits"
                                        : "does not step down of itself");
        *ret = TAKE_PTR(d);
        return 0;
}

struct domain *domain_free(struct domain *d)
{
        if (!d)
                return NULL;
        etcd_free(d->etcd);
        free(d->name);
        free(d->leader_key);
        free(d->journal_prefix);
        free(d->advertise);
        free(d);
        return NULL;
}

static void sleep_ms(uint64_t ms)
{
        struct timespec ts = {.tv_sec = (time_t)(ms / 1000),
                              .tv_nsec = (long)(ms % 1000) * 1000000};

        nanosleep(&ts, NULL);
}

/* Who leads now, for the log: the leader key's value and term, or why it cannot be read. */
static void describe_leader(struct domain *d, char *buf, size_t size)
{
        struct etcd_kv *kv = NULL;
        size_t n = 0;

        if (etcd_range(d->etcd, d->leader_key, false, &kv, &n, NULL) < 0)
                snprintf(buf, size, "etcd cannot say who leads: %s", etcd_error(d->etcd));
        else if (n == 0)
                snprintf(buf, size, "nobody leads");
        else
                snprintf(buf, size, "%.*s leads (term %" PRId64 ")", (int)MIN(kv[0].len, 200),
                         (const char *)kv[0].value, kv[0].create_revision);
        etcd_kvs_free(kv, n);
}

int domain_campaign(struct domain *d, volatile const bool *stop)
{
        /* Try again after a quarter of the TTL, at most every 250 ms: a failover takes at most
         * the TTL (the old lease expiring) and this. */
        uint64_t poll_ms = MIN((uint64_t)d->ttl_s * 1000 / 4, 250);
        char said[300] = "", now[300];

        while (!stop || !*stop) {
                uint64_t started = now_mono_ns();
                struct etcd_kv *kv = NULL;
                size_t n = 0;
                int r;

                if (!d->lease) {
                        r = etcd_lease_grant(d->etcd, d->ttl_s, &d->lease);
                        if (r < 0)
                                goto wait;
                        d->lease_until_ns = started + (uint64_t)d->ttl_s * NSEC_PER_SEC;
                } else {
                        r = etcd_lease_keepalive(d->etcd, d->lease);
                        if (r == -ENOENT) {
                                d->lease = 0;
                                continue;
                        }
                        if (r < 0)
                                goto wait;
                        d->lease_until_ns = started + (uint64_t)d->ttl_s * NSEC_PER_SEC;
                }
                const struct etcd_cmp absent = {.key = d->leader_key, .target = ETCD_CMP_CREATE};
                const struct etcd_op put = {.kind = ETCD_OP_PUT,
                                            .key = d->leader_key,
                                            .value = d->advertise,
                                            .len = strlen(d->advertise),
                                            .lease = d->lease};
                r = etcd_txn(d->etcd, &absent, 1, &put, 1, NULL);
                if (r == 1) {
                        r = etcd_range(d->etcd, d->leader_key, false, &kv, &n, NULL);
                        if (r >= 0 && n == 1 && kv[0].lease == d->lease) {
                                d->term = kv[0].create_revision;
                                etcd_kvs_free(kv, n);
                                d->leader = true;
                                d->renew_due_ns = started + (uint64_t)d->ttl_s * NSEC_PER_SEC / 3;
                                log_notice("Leading domain %s as %s (term %" PRId64
                                           ", lease %" PRIx64 ", TTL %" PRId64 " s)",
                                           d->name, d->advertise, d->term, (uint64_t)d->lease,
                                           d->ttl_s);
                                return 0;
                        }
                        etcd_kvs_free(kv, n);
                        /* Won and lost again at once (the lease expired meanwhile): campaign
                         * afresh. */
                        continue;
                }
        wait:
                if (r < 0)
                        snprintf(now, sizeof(now), "etcd: %s", etcd_error(d->etcd));
                else
                        describe_leader(d, now, sizeof(now));
                if (strcmp(now, said) != 0) {
                        log_notice("Waiting to lead domain %s: %s", d->name, now);
                        snprintf(said, sizeof(said), "%s", now);
                }
                sleep_ms(poll_ms);
        }
        return -ECANCELED;
}

struct etcd *domain_etcd(struct domain *d)
{
        return d->etcd;
}

const char *domain_journal_prefix(const struct domain *d)
{
        return d->journal_prefix;
}

struct journal_fence domain_fence(const struct domain *d)
{
        return (struct journal_fence){
            .key = d->leader_key, .revision = d->term, .lease = d->lease, .unfenced = d->unfenced};
}

uint64_t domain_deadline(const struct domain *d)
{
        if (!d->leader)
                return 0;
        return MIN(d->renew_due_ns, d->lease_until_ns);
}

static int step_down(struct domain *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int step_down(struct domain *d, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(d->lost, sizeof(d->lost), fmt, ap);
        va_end(ap);
        if (d->never_step_down) {
                /* Go on as if it still led; look again in a second. */
                d->lease_until_ns = UINT64_MAX;
                d->renew_due_ns = now_mono_ns() + NSEC_PER_SEC;
                return 0;
        }
        d->leader = false;
        return -ESTALE;
}

int domain_tick(struct domain *d, uint64_t now)
{
        int r;

        if (!d->leader)
                return -ESTALE;
        if (now < d->renew_due_ns && now < d->lease_until_ns)
                return 0;
        if (now >= d->lease_until_ns)
                return step_down(d, "its lease's TTL (%" PRId64 " s) passed with no renewal (%s)",
                                 d->ttl_s,
                                 etcd_error(d->etcd)[0] ? etcd_error(d->etcd)
                                                        : "no call to etcd failed: this aquad did "
                                                          "not run in time, paused or starved");
        r = etcd_lease_keepalive(d->etcd, d->lease);
        if (r == -ENOENT)
                return step_down(d, "etcd no longer has its lease");
        if (r < 0) {
                /* Try again soon, while the lease may still hold. */
                d->renew_due_ns = now + MIN((uint64_t)d->ttl_s * NSEC_PER_SEC / 10,
                                            (uint64_t)200 * NSEC_PER_MSEC);
                log_warning("Domain %s: cannot renew the leader's lease (%s); it holds for "
                            "%" PRIu64 " ms more",
                            d->name, etcd_error(d->etcd),
                            (d->lease_until_ns - now) / NSEC_PER_MSEC);
                return 0;
        }
        d->lease_until_ns = now + (uint64_t)d->ttl_s * NSEC_PER_SEC;
        d->renew_due_ns = now + (uint64_t)d->ttl_s * NSEC_PER_SEC / 3;
        return 0;
}

const char *domain_lost(const struct domain *d)
{
        return d->lost;
}

void domain_resign(struct domain *d)
{
        if (d->leader && d->lease && etcd_lease_revoke(d->etcd, d->lease) < 0)
                log_warning("Domain %s: could not give up the lead (%s); another aquad leads "
                            "once the lease's TTL passes",
                            d->name, etcd_error(d->etcd));
        d->leader = false;
}

void domain_view(const struct domain *d, struct domain_view *ret)
{
        *ret = (struct domain_view){
            .name = d->name,
            .advertise = d->advertise,
            .etcd_error = etcd_error(d->etcd),
            .term = d->term,
            .leader = d->leader,
            .commits = d->commits,
            .commit_seconds = d->commit_seconds,
        };
}

void domain_count_commit(struct domain *d, uint64_t ns)
{
        d->commits++;
        d->commit_seconds += (double)ns / 1e9;
}
