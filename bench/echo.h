/* The baseline of the control benchmarks: a ROUTER that sends every message straight back. */
#pragma once

/* Echo [routing id][body] on router until a receive fails, then exit the process. */
_Noreturn void echo_serve(void *router);
