/*
 * systemd service notifications (sd_notify): READY=1 once aquad serves, STATUS= lines that
 * systemctl status shows, STOPPING=1 when it begins to stop. Outside systemd (no
 * $NOTIFY_SOCKET) every call does nothing.
 */
#pragma once

struct server;

/* aquad serves requests now. */
void notify_ready(struct server *s);
/* Refresh STATUS= when the figures it shows have changed since the last one; cheap otherwise. */
void notify_status(struct server *s);
/* aquad is stopping, and why. */
void notify_stopping(const char *why);
