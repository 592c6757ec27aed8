"""Where a job's events go, as each person may read it: its owner and admins read the notify_url and
the owner's e-mail address whole; other roles read the receiver's scheme and host only (a webhook
address's path or query often holds the receiver's token, as Slack's do)."""

from urllib.parse import urlsplit

from ledger.models import Job, JobNotification, NotificationChannel

from .permissions import may_see_recipients


def shown_notify_url(user, job: Job) -> str:
    """The job's notify_url as `user` may read it: whole for its owner and admins, otherwise only
    its scheme and host (a receiver's path or query often holds its token)."""
    return shown_address(user, job, job.notify_url)


def shown_address(user, job: Job, url: str) -> str:
    if not url or may_see_recipients(user, job):
        return url
    parts = urlsplit(url)
    hidden = "/…" if parts.path.strip("/") or parts.query else ""
    return f"{parts.scheme}://{parts.netloc}{hidden}"


def shown_recipient(user, job: Job, notification: JobNotification) -> str:
    """Where a notification went, as `user` may read it: an e-mail address only to the owner and
    admins, a webhook's address as `shown_address` says."""
    if notification.channel == NotificationChannel.WEBHOOK:
        return shown_address(user, job, notification.recipient)
    return notification.recipient if may_see_recipients(user, job) else "the owner's e-mail address"
