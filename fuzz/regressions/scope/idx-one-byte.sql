#SQL
UPDATE "samples" SET "idx" = 7
UPDATE "probes" SET "run_id" = -1e308 WHERE rowid = (SELECT rowid FROM "probes" LIMIT 1 OFFSET 1)
DELETE FROM "steps" WHERE rowid = (SELECT rowid FROM "steps" LIMIT 1 OFFSET 4)
UPDATE "ranks" SET "dp" = '[-1,2]' WHERE rowid = (SELECT rowid FROM "ranks" LIMIT 1 OFFSET 1)
DELETE FROM "samples" WHERE rowid = (SELECT rowid FROM "samples" LIMIT 1 OFFSET 1)
