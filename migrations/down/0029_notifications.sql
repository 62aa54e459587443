-- Reverses migrations/0029_notifications.sql (`warden migrate --down-to
-- 28`). Loses the notification targets, the tenants' signing secrets and
-- the outbox: the previous release has no notifications. Undelivered ones
-- are dropped with it; set the targets again after upgrading once more.
DROP TRIGGER events_notify ON events;
DROP FUNCTION warden_notify_event();
DROP TABLE notifications;
DROP TABLE notify_secrets;
DROP TABLE notify_targets;
