-- 011: the convs page is in conv_id byte order (contract section 6,
-- "conversations in conv_id order after `after`"), whatever collation the
-- operator's database has: a database created with a language's collation
-- (say ICU en-US) would sort "abc" before "Zed" and "b_1" beside "B2".
-- The query compares and sorts conv_id COLLATE "C" (server/src/store_markers.cpp,
-- convs_sql); this index, read by that query (a user's conversations from
-- `after` on), is in the same order. In a database whose collation is C or
-- C.UTF-8 it is the index it replaces.
DROP INDEX IF EXISTS membership_by_user;
CREATE INDEX membership_by_user ON membership_periods (user_id, (conv_id COLLATE "C"));
