CREATE TABLE events (id TEXT PRIMARY KEY, timestamp INTEGER NOT NULL, pid INTEGER NOT NULL, tid INTEGER NOT NULL, source INTEGER NOT NULL, op INTEGER NOT NULL, duration INTEGER NOT NULL, gpu_id INTEGER NOT NULL DEFAULT 0, arg0 INTEGER NOT NULL DEFAULT 0, arg1 INTEGER NOT NULL DEFAULT 0, ret_code INTEGER NOT NULL DEFAULT 0, stack_hash INTEGER NOT NULL DEFAULT 0, cgroup_id INTEGER NOT NULL DEFAULT 0, node TEXT NOT NULL DEFAULT '', rank INTEGER);
CREATE INDEX idx_events_timestamp ON events(timestamp);
CREATE TABLE schema_info (key TEXT PRIMARY KEY, value TEXT);
INSERT INTO schema_info VALUES ('version', '0.9');
INSERT INTO events VALUES ('node-a:1', 1000, 1, 1, 1, 3, 10, 0, 0, 0, 0, 0, 0, 'node-a', 0);
INSERT INTO events VALUES ('node-b:1', 1200, 2, 2, 1, 3, 10, 0, 0, 0, 0, 0, 0, 'node-b', 1);
INSERT INTO events VALUES ('node-a:2', 5000, 1, 1, 3, 1, 3000, 0, 0, 0, 0, 0, 0, 'node-a', 0);
INSERT INTO events VALUES ('x:y:3', 900, 1, 1, 1, 5, 10, 0, 0, 0, 0, 0, 0, 'node-a', NULL);
