// Turns "old rows -> new rows" into the fine-grained QAbstractItemModel
// notifications (remove / move / insert / dataChanged) so views keep their
// scroll position and selection. Rows are matched by key; a model that
// cannot move rows (no beginMove) falls back to a reset when common rows
// changed order.
#pragma once

#include <QtCore/QHash>
#include <QtCore/QList>
#include <QtCore/QSet>

#include <functional>

namespace im::detail {

struct RowDiffOps {
    std::function<void(int, int)> beginRemove, beginInsert;
    std::function<void()> endRemove, endInsert, beginReset, endReset;
    std::function<void(int)> changed;
    /// Optional: move row `from` to stand before row `to` (beginMoveRows'
    /// destinationChild semantics) / end of that move.
    std::function<void(int, int)> beginMove;
    std::function<void()> endMove;
};

template <typename Row, typename KeyFn>
void applyRowDiff(QList<Row> &cur, const QList<Row> &fresh, KeyFn key, const RowDiffOps &ops) {
    QSet<QString> freshKeys;
    for (const Row &r : fresh)
        freshKeys.insert(key(r));
    // 1. removals, in contiguous runs from the back
    for (int i = int(cur.size()) - 1; i >= 0;) {
        if (freshKeys.contains(key(cur[i]))) {
            --i;
            continue;
        }
        int first = i;
        while (first > 0 && !freshKeys.contains(key(cur[first - 1])))
            --first;
        ops.beginRemove(first, i);
        cur.remove(first, i - first + 1);
        ops.endRemove();
        i = first - 1;
    }
    // 2. the remaining rows take the fresh relative order: moved one by one
    // (a conversation that got a new message moves to the top), or reset
    QHash<QString, int> freshPos;
    for (int i = 0; i < fresh.size(); ++i)
        freshPos.insert(key(fresh[i]), i);
    bool ordered = true;
    for (int i = 1; i < cur.size() && ordered; ++i)
        ordered = freshPos.value(key(cur[i - 1])) < freshPos.value(key(cur[i]));
    if (!ordered) {
        if (!ops.beginMove) {
            ops.beginReset();
            cur = fresh;
            ops.endReset();
            return;
        }
        QList<QString> target; // the keys of cur in fresh order
        target.reserve(cur.size());
        for (const Row &r : fresh)
            if (freshKeys.contains(key(r)))
                target.append(key(r));
        QSet<QString> present;
        for (const Row &r : cur)
            present.insert(key(r));
        target.removeIf([&present](const QString &k) { return !present.contains(k); });
        for (int i = 0; i < target.size(); ++i) {
            if (key(cur[i]) == target[i])
                continue;
            int j = i + 1;
            while (key(cur[j]) != target[i])
                ++j;
            ops.beginMove(j, i);
            cur.move(j, i);
            ops.endMove();
        }
    }
    // 3. insertions and in-place changes
    int j = 0;
    for (int i = 0; i < fresh.size();) {
        if (j < cur.size() && key(cur[j]) == key(fresh[i])) {
            if (!(cur[j] == fresh[i])) {
                cur[j] = fresh[i];
                ops.changed(j);
            }
            ++i;
            ++j;
            continue;
        }
        int n = 0;
        while (i + n < fresh.size() && (j >= cur.size() || key(fresh[i + n]) != key(cur[j])))
            ++n;
        ops.beginInsert(j, j + n - 1);
        for (int k = 0; k < n; ++k)
            cur.insert(j + k, fresh[i + k]);
        ops.endInsert();
        i += n;
        j += n;
    }
}

} // namespace im::detail
