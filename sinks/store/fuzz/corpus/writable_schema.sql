CREATE TABLE events (id INTEGER PRIMARY KEY, timestamp INTEGER NOT NULL, pid INTEGER NOT NULL, tid INTEGER NOT NULL, source INTEGER NOT NULL, op INTEGER NOT NULL, duration INTEGER NOT NULL, gpu_id INTEGER GENERATED ALWAYS AS (coalesce(pid, 1)));
CREATE INDEX idx_events_timestamp ON events(timestamp DESC);
INSERT INTO events(id, timestamp, pid, tid, source, op, duration) VALUES (1, 3000, 1, 1, 1, 3, 10), (2, 1000, 1, 1, 1, 3, 10), (3, 2000, 1, 1, 3, 1, 1500);
PRAGMA writable_schema = ON;
UPDATE sqlite_master SET sql = replace(sql, 'coalesce(', 'ingero_row(') WHERE name = 'events';
UPDATE sqlite_master SET sql = replace(sql, ' DESC', '') WHERE name = 'idx_events_timestamp';
