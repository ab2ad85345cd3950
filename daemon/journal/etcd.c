/* etcd's v3 JSON gateway over libcurl: requests built and answers read with json-c. */
#include "etcd.h"

#include <curl/curl.h>
#include <errno.h>
#include <json-c/json.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct etcd {
        CURL *curl;
        char **urls;
        size_t n_urls, current;
        char *ca_file, *cert_file, *key_file, *user, *password;
        char *token; /* etcd's auth token, once authenticated */
        uint64_t timeout_ms;
        char error[256];
        struct etcd_stats stats;
        /* the answer being read */
        char *body;
        size_t body_len;
        /* etcd_watch(): the stream is read until an event comes */
        bool watching, watch_hit;
};

static size_t on_data(char *data, size_t size, size_t n, void *userdata)
{
        struct etcd *e = userdata;
        size_t len = size * n;
        char *b;

        if (e->body_len + len > (64u << 20))
                return 0; /* an answer no call of ours asks for */
        b = realloc(e->body, e->body_len + len + 1);
        if (!b)
                return 0;
        memcpy(b + e->body_len, data, len);
        e->body = b;
        e->body_len += len;
        b[e->body_len] = 0;
        /* A watch's stream: an event, or etcd cancelling the watch (its revision compacted
         * away), ends it; both mean "look again". */
        if (e->watching && (strstr(e->body, "\"events\"") || strstr(e->body, "\"canceled\""))) {
                e->watch_hit = true;
                return 0;
        }
        return len;
}

static char *dup_or_null(const char *s)
{
        return s ? strdup(s) : NULL;
}

int etcd_new(const struct etcd_options *o, struct etcd **ret)
{
        _cleanup_(etcd_freep) struct etcd *e = NULL;

        if (o->n_urls == 0)
                return -EINVAL;
        e = calloc(1, sizeof(*e));
        if (!e)
                return -ENOMEM;
        e->urls = calloc(o->n_urls, sizeof(*e->urls));
        if (!e->urls)
                return -ENOMEM;
        for (size_t i = 0; i < o->n_urls; i++, e->n_urls++) {
                /* "http://a:2379/" and "http://a:2379" are one endpoint */
                size_t n = strlen(o->urls[i]);
                while (n && o->urls[i][n - 1] == '/')
                        n--;
                if (!(e->urls[i] = strndup(o->urls[i], n)))
                        return -ENOMEM;
        }
        e->ca_file = dup_or_null(o->ca_file);
        e->cert_file = dup_or_null(o->cert_file);
        e->key_file = dup_or_null(o->key_file);
        e->user = dup_or_null(o->user);
        e->password = dup_or_null(o->password);
        e->timeout_ms = o->timeout_ms ? o->timeout_ms : 2000;
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0 || !(e->curl = curl_easy_init()))
                return -ENOMEM;
        *ret = TAKE_PTR(e);
        return 0;
}

struct etcd *etcd_free(struct etcd *e)
{
        if (!e)
                return NULL;
        if (e->curl)
                curl_easy_cleanup(e->curl);
        for (size_t i = 0; i < e->n_urls; i++)
                free(e->urls[i]);
        free(e->urls);
        free(e->ca_file);
        free(e->cert_file);
        free(e->key_file);
        free(e->user);
        if (e->password)
                explicit_bzero(e->password, strlen(e->password));
        free(e->password);
        free(e->token);
        free(e->body);
        free(e);
        return NULL;
}

const char *etcd_error(const struct etcd *e)
{
        return e->error;
}

void etcd_stats(const struct etcd *e, struct etcd_stats *ret)
{
        *ret = e->stats;
}

static int fail(struct etcd *e, int r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct etcd *e, int r, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(e->error, sizeof(e->error), fmt, ap);
        va_end(ap);
        return r;
}

/* POST one request to one endpoint: the HTTP status, or a negative errno when none came. */
static long post_to(struct etcd *e, const char *url, const char *path, const char *json,
                    uint64_t timeout_ms, CURLcode *ret_code)
{
        _cleanup_free_ char *full = NULL, *auth = NULL;
        struct curl_slist *headers = NULL;
        long status = 0;
        CURLcode c;

        if (asprintf(&full, "%s%s", url, path) < 0)
                return -ENOMEM;
        headers = curl_slist_append(headers, "Content-Type: application/json");
        /* No "Expect: 100-continue" round trip before a larger body. */
        headers = curl_slist_append(headers, "Expect:");
        if (e->token && asprintf(&auth, "Authorization: %s", e->token) >= 0)
                headers = curl_slist_append(headers, auth);
        free(e->body);
        e->body = NULL;
        e->body_len = 0;
        curl_easy_reset(e->curl);
        curl_easy_setopt(e->curl, CURLOPT_URL, full);
        curl_easy_setopt(e->curl, CURLOPT_POSTFIELDS, json);
        curl_easy_setopt(e->curl, CURLOPT_HTTPHEADER, headers);
        curl_easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(e->curl, CURLOPT_WRITEDATA, e);
        curl_easy_setopt(e->curl, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
        curl_easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT_MS, (long)timeout_ms);
        curl_easy_setopt(e->curl, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e->curl, CURLOPT_PROTOCOLS_STR, "http,https");
        if (e->ca_file)
                curl_easy_setopt(e->curl, CURLOPT_CAINFO, e->ca_file);
        if (e->cert_file)
                curl_easy_setopt(e->curl, CURLOPT_SSLCERT, e->cert_file);
        if (e->key_file)
                curl_easy_setopt(e->curl, CURLOPT_SSLKEY, e->key_file);
        c = curl_easy_perform(e->curl);
        curl_slist_free_all(headers);
        *ret_code = c;
        if (c != CURLE_OK)
                return c == CURLE_OUT_OF_MEMORY ? -ENOMEM : -EHOSTUNREACH;
        curl_easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, &status);
        return status;
}

static const char *answer_error(json_object *o)
{
        json_object *m;

        if (o && (json_object_object_get_ex(o, "message", &m) ||
                  json_object_object_get_ex(o, "error", &m)))
                return json_object_get_string(m);
        return "no message";
}

static int authenticate(struct etcd *e, const char *url);

/*
 * POST json to path on the endpoint that answered last, else on each of the others in turn;
 * *ret the answer (200). An endpoint that answers with an error is not tried past: the cluster
 * said no.
 */
static int post(struct etcd *e, const char *path, json_object *req, json_object **ret)
{
        const char *json = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
        uint64_t per = e->timeout_ms / e->n_urls;
        bool reauth = false;
        CURLcode code = CURLE_OK;

        if (!json)
                return -ENOMEM;
        e->stats.requests++;
        e->stats.largest_request = MAX(e->stats.largest_request, (uint64_t)strlen(json));
        for (size_t k = 0; k < e->n_urls; k++) {
                size_t i = (e->current + k) % e->n_urls;
                long status;

                if (e->user && !e->token) {
                        int a = authenticate(e, e->urls[i]);

                        /* Refused: the cluster said no, with the reason in e->error. */
                        if (a == -EACCES || a == -ENOMEM)
                                return a;
                        if (a < 0)
                                continue;
                }
                status = post_to(e, e->urls[i], path, json, per ? per : 1, &code);
                if (status == -ENOMEM)
                        return fail(e, -ENOMEM, "out of memory");
                if (status < 0)
                        continue;
                e->current = i;
                json_object *o = e->body ? json_tokener_parse(e->body) : NULL;
                if (status == 200 && o) {
                        *ret = o;
                        e->error[0] = 0;
                        return 0;
                }
                /* An expired auth token: once more with a new one. */
                if (status == 401 && e->user && !reauth) {
                        reauth = true;
                        free(e->token);
                        e->token = NULL;
                        k--;
                        json_object_put(o);
                        continue;
                }
                fail(e, status == 401 || status == 403 ? -EACCES : -EPROTO,
                     "etcd at %s answered %s with HTTP %ld: %s", e->urls[i], path, status,
                     answer_error(o));
                json_object_put(o);
                return status == 401 || status == 403 ? -EACCES : -EPROTO;
        }
        return fail(e, -EHOSTUNREACH, "no etcd endpoint answered %s (last: %s)", path,
                    curl_easy_strerror(code));
}

static int authenticate(struct etcd *e, const char *url)
{
        json_object *req = json_object_new_object(), *o = NULL, *t;
        CURLcode code;
        long status;
        int r = -EACCES;

        if (!req)
                return -ENOMEM;
        json_object_object_add(req, "name", json_object_new_string(e->user));
        json_object_object_add(req, "password",
                               json_object_new_string(e->password ? e->password : ""));
        status = post_to(e, url, "/v3/auth/authenticate",
                         json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN),
                         e->timeout_ms / e->n_urls ? e->timeout_ms / e->n_urls : 1, &code);
        json_object_put(req);
        if (status < 0)
                return fail(e, (int)status, "etcd at %s: %s", url, curl_easy_strerror(code));
        o = e->body ? json_tokener_parse(e->body) : NULL;
        if (status == 200 && o && json_object_object_get_ex(o, "token", &t)) {
                free(e->token);
                e->token = strdup(json_object_get_string(t));
                r = e->token ? 0 : -ENOMEM;
        } else
                fail(e, r, "etcd at %s refused user %s: %s", url, e->user, answer_error(o));
        json_object_put(o);
        return r;
}

/* ------------------------------------------------------------------------------ values */

static json_object *b64(const void *data, size_t len)
{
        size_t n = sodium_base64_encoded_len(len, sodium_base64_VARIANT_ORIGINAL);
        _cleanup_free_ char *s = malloc(n);

        if (!s)
                return NULL;
        sodium_bin2base64(s, n, data, len, sodium_base64_VARIANT_ORIGINAL);
        return json_object_new_string(s);
}

static int unb64(json_object *o, uint8_t **ret, size_t *ret_len)
{
        const char *s = o ? json_object_get_string(o) : "";
        size_t n = strlen(s), len = 0;
        uint8_t *buf = malloc(n / 4 * 3 + 4);

        if (!buf)
                return -ENOMEM;
        if (sodium_base642bin(buf, n / 4 * 3 + 4, s, n, NULL, &len, NULL,
                              sodium_base64_VARIANT_ORIGINAL) < 0) {
                free(buf);
                return -EBADMSG;
        }
        buf[len] = 0; /* keys are read as strings */
        *ret = buf;
        *ret_len = len;
        return 0;
}

static json_object *i64(int64_t v)
{
        char s[24];

        snprintf(s, sizeof(s), "%lld", (long long)v);
        return json_object_new_string(s);
}

static int64_t get_i64(json_object *o, const char *name)
{
        json_object *v;

        return json_object_object_get_ex(o, name, &v) ? json_object_get_int64(v) : 0;
}

/* The first key after every key that starts with prefix (etcd's range_end for a prefix). */
static json_object *prefix_end(const char *prefix)
{
        size_t n = strlen(prefix);
        _cleanup_free_ uint8_t *end = malloc(n + 1);

        if (!end)
                return NULL;
        memcpy(end, prefix, n);
        while (n > 0) {
                if (end[n - 1] < 0xff) {
                        end[n - 1]++;
                        return b64(end, n);
                }
                n--;
        }
        return b64("\0", 1); /* all keys */
}

static int64_t header_revision(json_object *o)
{
        json_object *h;

        return json_object_object_get_ex(o, "header", &h) ? get_i64(h, "revision") : 0;
}

/* ------------------------------------------------------------------------------ calls */

/* The lease calls: POST {"NAME": value} to path, the answer in *ret. */
static int lease_call(struct etcd *e, const char *path, const char *name, int64_t value,
                      json_object **ret)
{
        json_object *req = json_object_new_object();
        int r;

        if (!req)
                return -ENOMEM;
        json_object_object_add(req, name, i64(value));
        r = post(e, path, req, ret);
        json_object_put(req);
        return r;
}

int etcd_lease_grant(struct etcd *e, int64_t ttl_s, int64_t *ret_id)
{
        json_object *o = NULL;
        int r = lease_call(e, "/v3/lease/grant", "TTL", ttl_s, &o);

        if (r < 0)
                return r;
        *ret_id = get_i64(o, "ID");
        json_object_put(o);
        return *ret_id ? 0 : fail(e, -EPROTO, "etcd granted no lease");
}

int etcd_lease_keepalive(struct etcd *e, int64_t id)
{
        json_object *o = NULL, *res;
        int r = lease_call(e, "/v3/lease/keepalive", "ID", id, &o);

        if (r < 0)
                return r;
        /* An expired lease comes back with no TTL (0). */
        r = json_object_object_get_ex(o, "result", &res) && get_i64(res, "TTL") > 0
                ? 0
                : fail(e, -ENOENT, "etcd no longer has lease %llx", (long long)id);
        json_object_put(o);
        return r;
}

int etcd_lease_revoke(struct etcd *e, int64_t id)
{
        json_object *o = NULL;
        int r = lease_call(e, "/v3/lease/revoke", "ID", id, &o);

        json_object_put(o);
        return r;
}

void etcd_kvs_free(struct etcd_kv *kvs, size_t n)
{
        for (size_t i = 0; kvs && i < n; i++) {
                free(kvs[i].key);
                free(kvs[i].value);
        }
        free(kvs);
}

static int read_kvs(json_object *o, struct etcd_kv **ret, size_t *ret_n)
{
        json_object *arr;
        size_t n;
        struct etcd_kv *kvs;

        *ret = NULL;
        *ret_n = 0;
        if (!json_object_object_get_ex(o, "kvs", &arr))
                return 0;
        n = json_object_array_length(arr);
        kvs = calloc(n ? n : 1, sizeof(*kvs));
        if (!kvs)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                json_object *kv = json_object_array_get_idx(arr, i), *k = NULL, *v = NULL;
                size_t klen;
                int r;

                json_object_object_get_ex(kv, "key", &k);
                json_object_object_get_ex(kv, "value", &v);
                r = unb64(k, (uint8_t **)&kvs[i].key, &klen);
                if (r >= 0)
                        r = unb64(v, &kvs[i].value, &kvs[i].len);
                if (r < 0) {
                        etcd_kvs_free(kvs, i + 1);
                        return r;
                }
                kvs[i].create_revision = get_i64(kv, "create_revision");
                kvs[i].mod_revision = get_i64(kv, "mod_revision");
                kvs[i].version = get_i64(kv, "version");
                kvs[i].lease = get_i64(kv, "lease");
        }
        *ret = kvs;
        *ret_n = n;
        return 0;
}

/* A range from key to end (NULL: key alone), at most limit keys (0: all) as of revision (0: now). */
static int range(struct etcd *e, const char *key, json_object *end, size_t limit,
                 int64_t revision, struct etcd_kv **ret, size_t *ret_n, int64_t *ret_revision,
                 bool *ret_more)
{
        json_object *req = json_object_new_object(), *o = NULL, *more;
        int r;

        if (!req) {
                json_object_put(end);
                return -ENOMEM;
        }
        json_object_object_add(req, "key", b64(key, strlen(key)));
        if (end)
                json_object_object_add(req, "range_end", end);
        if (limit)
                json_object_object_add(req, "limit", i64((int64_t)limit));
        if (revision)
                json_object_object_add(req, "revision", i64(revision));
        json_object_object_add(req, "sort_order", json_object_new_string("ASCEND"));
        json_object_object_add(req, "sort_target", json_object_new_string("KEY"));
        r = post(e, "/v3/kv/range", req, &o);
        json_object_put(req);
        if (r < 0)
                return r;
        r = read_kvs(o, ret, ret_n);
        if (ret_revision)
                *ret_revision = header_revision(o);
        if (ret_more)
                *ret_more = json_object_object_get_ex(o, "more", &more) &&
                            json_object_get_boolean(more);
        json_object_put(o);
        return r < 0 ? fail(e, r, "etcd's answer to a range has a bad key or value") : 0;
}

int etcd_range(struct etcd *e, const char *key, bool prefix, struct etcd_kv **ret, size_t *ret_n,
               int64_t *ret_revision)
{
        return range(e, key, prefix ? prefix_end(key) : NULL, 0, 0, ret, ret_n, ret_revision, NULL);
}

int etcd_range_page(struct etcd *e, const char *prefix, const char *from, int64_t revision,
                    size_t limit, struct etcd_kv **ret, size_t *ret_n, int64_t *ret_revision,
                    bool *ret_more)
{
        return range(e, from ? from : prefix, prefix_end(prefix), limit, revision, ret, ret_n,
                     ret_revision, ret_more);
}

int etcd_watch(struct etcd *e, const char *key, int64_t revision, uint64_t timeout_ms)
{
        json_object *req = json_object_new_object(), *create = json_object_new_object();
        const char *json;
        CURLcode code = CURLE_OK;
        long status;

        if (!req || !create) {
                json_object_put(req);
                json_object_put(create);
                return -ENOMEM;
        }
        json_object_object_add(create, "key", b64(key, strlen(key)));
        json_object_object_add(create, "start_revision", i64(revision + 1));
        json_object_object_add(req, "create_request", create);
        json = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
        e->stats.requests++;
        e->watching = true;
        e->watch_hit = false;
        status = json ? post_to(e, e->urls[e->current], "/v3/watch", json, timeout_ms, &code)
                      : -ENOMEM;
        e->watching = false;
        json_object_put(req);
        if (e->watch_hit)
                return 1;
        if (code == CURLE_OPERATION_TIMEDOUT)
                return 0;
        if (status < 0) {
                fail(e, (int)status, "etcd at %s: watching %s: %s", e->urls[e->current], key,
                     curl_easy_strerror(code));
                /* This endpoint is gone: the next call starts from another. */
                e->current = (e->current + 1) % e->n_urls;
                return (int)status;
        }
        return fail(e, -EPROTO, "etcd at %s ended the watch of %s (HTTP %ld)",
                    e->urls[e->current], key, status);
}

int etcd_txn(struct etcd *e, const struct etcd_cmp *cmp, size_t n_cmp, const struct etcd_op *ops,
             size_t n_ops, int64_t *ret_revision)
{
        json_object *req = json_object_new_object(), *cmps = json_object_new_array(),
                    *succ = json_object_new_array(), *o = NULL, *ok;
        int r;

        if (!req || !cmps || !succ) {
                json_object_put(req);
                json_object_put(cmps);
                json_object_put(succ);
                return -ENOMEM;
        }
        for (size_t i = 0; i < n_cmp; i++) {
                json_object *c = json_object_new_object();

                json_object_object_add(c, "key", b64(cmp[i].key, strlen(cmp[i].key)));
                json_object_object_add(c, "result", json_object_new_string("EQUAL"));
                if (cmp[i].target == ETCD_CMP_CREATE) {
                        json_object_object_add(c, "target", json_object_new_string("CREATE"));
                        json_object_object_add(c, "create_revision", i64(cmp[i].value));
                } else if (cmp[i].target == ETCD_CMP_VERSION) {
                        json_object_object_add(c, "target", json_object_new_string("VERSION"));
                        json_object_object_add(c, "version", i64(cmp[i].value));
                } else {
                        json_object_object_add(c, "target", json_object_new_string("LEASE"));
                        json_object_object_add(c, "lease", i64(cmp[i].value));
                }
                json_object_array_add(cmps, c);
        }
        for (size_t i = 0; i < n_ops; i++) {
                json_object *op = json_object_new_object(), *body = json_object_new_object();

                json_object_object_add(body, "key", b64(ops[i].key, strlen(ops[i].key)));
                if (ops[i].kind == ETCD_OP_PUT) {
                        json_object_object_add(body, "value", b64(ops[i].value, ops[i].len));
                        if (ops[i].lease)
                                json_object_object_add(body, "lease", i64(ops[i].lease));
                        json_object_object_add(op, "request_put", body);
                } else if (ops[i].kind == ETCD_OP_DELETE) {
                        json_object_object_add(op, "request_delete_range", body);
                } else {
                        json_object_object_add(body, "range_end",
                                               ops[i].end ? b64(ops[i].end, strlen(ops[i].end))
                                                          : prefix_end(ops[i].key));
                        json_object_object_add(op, "request_delete_range", body);
                }
                json_object_array_add(succ, op);
        }
        json_object_object_add(req, "compare", cmps);
        json_object_object_add(req, "success", succ);
        r = post(e, "/v3/kv/txn", req, &o);
        json_object_put(req);
        if (r < 0)
                return r;
        r = json_object_object_get_ex(o, "succeeded", &ok) && json_object_get_boolean(ok);
        if (ret_revision)
                *ret_revision = header_revision(o);
        json_object_put(o);
        return r;
}
