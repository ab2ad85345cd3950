/* Fuzz harness for Envelope decoding under limits, and the round trip of what decodes. */
#include <stdint.h>
#include <stdlib.h>

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct wire_limits limits = WIRE_LIMITS_DEFAULT;
        Aqua__Envelope *e = NULL, *again = NULL;
        void *buf = NULL;
        size_t len;
        char err[256];

        if (wire_decode(data, size, &limits, &e, err, sizeof(err)) != 0)
                return 0;
        (void)wire_body_name(e);
        /* Whatever decodes within the limits encodes again and decodes to the same size. */
        limits.max_message = SIZE_MAX;
        if (wire_encode(e, &buf, &len) == 0 &&
            wire_decode(buf, len, &limits, &again, NULL, 0) == 0 &&
            aqua__envelope__get_packed_size(again) != len)
                abort();
        if (again)
                aqua__envelope__free_unpacked(again, NULL);
        free(buf);
        aqua__envelope__free_unpacked(e, NULL);
        return 0;
}
