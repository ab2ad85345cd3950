/* The raw ZeroMQ echo the control benchmarks measure aquad against. */
#include "echo.h"

#include <unistd.h>
#include <zmq.h>

_Noreturn void echo_serve(void *router)
{
        for (;;) {
                zmq_msg_t id, body;

                zmq_msg_init(&id);
                zmq_msg_init(&body);
                if (zmq_msg_recv(&id, router, 0) < 0 || zmq_msg_recv(&body, router, 0) < 0)
                        _exit(0);
                zmq_msg_send(&id, router, ZMQ_SNDMORE);
                zmq_msg_send(&body, router, 0);
        }
}
