-- 018: each msg's reactions summary, kept at write time (issue 49, the
-- heavy-history goal; docs/benchmarks.md, "Pages with edits and reactions").
--
-- msg_changes.reactions_top is what a page shows of a msg's reactions apart
-- from `me`: its top 20 emoji by count (most counted first, then the emoji's
-- bytes), as the JSON text [["emoji", count], ...]; NULL when no emoji has a
-- count. im_change (schema/functions/im_change.sql) rewrites it in the same
-- statement as reaction_counts, under the conversation row lock, so it is
-- always the top 20 of the counts of its snapshot. A page reads it as is
-- and adds `me` from the reader's own reaction_state rows: before, every
-- page ranked all the counts of its messages and built their lists again
-- (the heavy page's statement cost 5-15x the events' own).
ALTER TABLE msg_changes ADD COLUMN reactions_top text;

-- The rows written before this migration (the column is new: nothing else
-- writes it until the gateways of this release run im_change).
UPDATE msg_changes x SET reactions_top = (
    SELECT json_agg(json_build_array(t.emoji, t.count) ORDER BY t.count DESC, t.emoji COLLATE "C")::text
      FROM (SELECT n.emoji, n.count FROM reaction_counts n
             WHERE n.conv_id = x.conv_id AND n.target_seq = x.seq AND n.count > 0
             ORDER BY n.count DESC, n.emoji COLLATE "C" LIMIT 20) t)
 WHERE x.reactions_seq IS NOT NULL;
