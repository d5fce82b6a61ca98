CREATE VIEW events AS WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT i AS id, i AS timestamp, 1 AS pid, 1 AS tid, 1 AS source, 3 AS op, 1 AS duration FROM n;
