// Turns "old rows -> new rows" into the fine-grained QAbstractItemModel
// notifications (remove / insert / dataChanged) so views keep their scroll
// position and selection; falls back to a reset when common rows moved.
#pragma once

#include <QtCore/QList>
#include <QtCore/QSet>

#include <functional>

namespace im::detail {

struct RowDiffOps {
    std::function<void(int, int)> beginRemove, beginInsert;
    std::function<void()> endRemove, endInsert, beginReset, endReset;
    std::function<void(int)> changed;
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
    // 2. the remaining rows must keep their relative order, else reset
    QHash<QString, int> freshPos;
    for (int i = 0; i < fresh.size(); ++i)
        freshPos.insert(key(fresh[i]), i);
    int last = -1;
    for (const Row &r : cur) {
        const int p = freshPos.value(key(r));
        if (p < last) {
            ops.beginReset();
            cur = fresh;
            ops.endReset();
            return;
        }
        last = p;
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
