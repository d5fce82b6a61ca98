CREATE TABLE events (id TEXT, timestamp INTEGER, pid INTEGER, tid INTEGER, source INTEGER, op INTEGER, duration INTEGER);
CREATE INDEX idx_events_timestamp ON events(timestamp);
INSERT INTO events VALUES ('b:1', 2000, 1, 1, 1, 3, 5), ('a:2', 1000, 2, 2, 1, 3, 5);
