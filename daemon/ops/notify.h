/*
 * systemd service notifications (sd_notify): READY=1 once aquad serves, STATUS= lines that
 * systemctl status shows, STOPPING=1 when it begins to stop. Outside systemd (no
 * $NOTIFY_SOCKET) every call does nothing.
 */
#pragma once

#include <stddef.h>

struct broker;

/* aquad serves requests now, to n_clients clients of pool p. */
void notify_ready(const struct broker *broker, size_t n_clients);
/* Refresh STATUS= when the figures it shows have changed since the last one; cheap otherwise. */
void notify_status(const struct broker *broker, size_t n_clients);
/* aquad is stopping, and why. */
void notify_stopping(const char *why);
