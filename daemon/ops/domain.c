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
        /* Tests only (AQUA_DOMAIN_TEST, in a build with -Dtest_hooks=true): "trust-fence":
         * never step down of itself, so that only the journal's fence stops a deposed leader;
         * "no-fence": neither. */
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
            asprintf(&d->journal_prefix, "/aqua/%s/", c->name) < 0 ||
            !(d->name = strdup(c->name)) ||
            !(d->advertise = strdup(c->advertise ? c->advertise : endpoint)))
                return -ENOMEM;
        r = etcd_new(&o, &d->etcd);
        if (r < 0)
                return r;
#ifdef AQUA_TEST_HOOKS
        if (test && strcmp(test, "trust-fence") == 0)
                d->never_step_down = true;
        if (test && strcmp(test, "no-fence") == 0)
                d->never_step_down = d->unfenced = true;
        if (d->never_step_down)
                log_warning("AQUA_DOMAIN_TEST=%s: this aquad %s (for tests only)", test,
                            d->unfenced ? "neither steps down nor fences its commits"
                                        : "does not step down of itself");
#else
        if (test && test[0])
                log_warning("AQUA_DOMAIN_TEST=%s is ignored: this aquad was built without test "
                            "switches (meson -Dtest_hooks)",
                            test);
#endif
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

/* How long a waiting instance watches the election key before it looks again of itself (half
 * the TTL, at least a second): long enough to cost etcd under one request a second at the default
 * TTL, short enough that a waiter names etcd's trouble (lost quorum) within a TTL. */
#define WATCH_MIN_MS 1000

/*
 * Who leads: 1 and a line for the log when someone does, with the revision to watch from; 0
 * when nobody does; or a negative errno. A leader key with this instance's own address and
 * another lease is its predecessor's, which died before it could give up the lead: revoked, so
 * that a restart need not wait for its TTL, and 0.
 */
static int who_leads(struct domain *d, char *buf, size_t size, int64_t *ret_revision)
{
        struct etcd_kv *kv = NULL;
        size_t n = 0;
        int r;

        r = etcd_range(d->etcd, d->leader_key, false, &kv, &n, ret_revision);
        if (r < 0) {
                snprintf(buf, size, "etcd cannot say who leads: %s", etcd_error(d->etcd));
                return r;
        }
        if (n == 0) {
                snprintf(buf, size, "nobody leads");
                etcd_kvs_free(kv, n);
                return 0;
        }
        if (kv[0].len == strlen(d->advertise) &&
            memcmp(kv[0].value, d->advertise, kv[0].len) == 0 && kv[0].lease != d->lease) {
                log_notice("Domain %s: the leader's key names this instance (%s) with lease %" PRIx64
                           ", not its own: its predecessor's, given up now",
                           d->name, d->advertise, (uint64_t)kv[0].lease);
                r = etcd_lease_revoke(d->etcd, kv[0].lease);
                etcd_kvs_free(kv, n);
                if (r < 0 && r != -ENOENT) {
                        snprintf(buf, size, "cannot give up its predecessor's lead: %s",
                                 etcd_error(d->etcd));
                        return r;
                }
                return 0;
        }
        snprintf(buf, size, "%.*s leads (term %" PRId64 ")", (int)MIN(kv[0].len, 200),
                 (const char *)kv[0].value, kv[0].create_revision);
        etcd_kvs_free(kv, n);
        return 1;
}

/* Try to create the leader key with a lease of ours: 1 won, 0 another has it, or an error. */
static int try_lead(struct domain *d, uint64_t started)
{
        int r;

        if (d->lease) {
                r = etcd_lease_keepalive(d->etcd, d->lease);
                if (r == -ENOENT)
                        d->lease = 0;
                else if (r < 0)
                        return r;
        }
        if (!d->lease) {
                r = etcd_lease_grant(d->etcd, d->ttl_s, &d->lease);
                if (r < 0)
                        return r;
        }
        d->lease_until_ns = started + (uint64_t)d->ttl_s * NSEC_PER_SEC;
        const struct etcd_cmp absent = {.key = d->leader_key, .target = ETCD_CMP_CREATE};
        const struct etcd_op put = {.kind = ETCD_OP_PUT,
                                    .key = d->leader_key,
                                    .value = d->advertise,
                                    .len = strlen(d->advertise),
                                    .lease = d->lease};
        return etcd_txn(d->etcd, &absent, 1, &put, 1, NULL);
}

int domain_campaign(struct domain *d, volatile const bool *stop)
{
        /* After an error, try again after a quarter of the TTL, at most 250 ms. */
        uint64_t retry_ms = MIN((uint64_t)d->ttl_s * 1000 / 4, 250);
        char said[300] = "", now[300];

        while (!stop || !*stop) {
                uint64_t started = now_mono_ns();
                struct etcd_kv *kv = NULL;
                int64_t revision = 0;
                size_t n = 0;
                int r;

                bool won = false;

                r = who_leads(d, now, sizeof(now), &revision);
                if (r == 0) {
                        r = try_lead(d, started);
                        if (r == 0)
                                continue; /* another won the race */
                        if (r < 0)
                                snprintf(now, sizeof(now), "etcd: %s", etcd_error(d->etcd));
                        won = r == 1;
                }
                if (won) {
                        /* Won: read back, for the term. */
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
                        /* Won and lost again at once (the lease expired meanwhile). */
                        continue;
                }
                if (strcmp(now, said) != 0) {
                        log_notice("Waiting to lead domain %s: %s", d->name, now);
                        snprintf(said, sizeof(said), "%s", now);
                }
                if (r < 0) {
                        sleep_ms(retry_ms);
                        continue;
                }
                /* Someone leads: wait for its key to change (etcd's Watch), not polling. */
                r = etcd_watch(d->etcd, d->leader_key, revision,
                               MAX((uint64_t)d->ttl_s * 1000 / 2, WATCH_MIN_MS));
                if (r < 0)
                        sleep_ms(retry_ms);
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
