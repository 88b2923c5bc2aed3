#include <im/reversedproxymodel.h>

namespace im {

// A QSortFilterProxyModel sorted by source row, descending: it already turns
// every insert, removal, move and change of the source into the matching
// fine-grained change of the sorted rows (a row inserted at the source's
// row 0 lands at the end here), keeps persistent indexes, and filters.
ReversedProxyModel::ReversedProxyModel(QObject *parent) : QSortFilterProxyModel(parent) {
    setDynamicSortFilter(true);
    QSortFilterProxyModel::sort(0, Qt::AscendingOrder);
}

ReversedProxyModel::~ReversedProxyModel() = default;

void ReversedProxyModel::setSourceModel(QAbstractItemModel *source) {
    if (QAbstractItemModel *old = sourceModel())
        disconnect(old, &QObject::destroyed, this, nullptr);
    QSortFilterProxyModel::setSourceModel(source);
    QSortFilterProxyModel::sort(0, Qt::AscendingOrder);
    // QSortFilterProxyModel drops a destroyed source's rows without telling
    // its views; a QTableView scrolled down then loops for ever in
    // sizeHintForColumn() (its header still has the rows, the model has
    // none). Tell them: a reset to no rows.
    if (source)
        connect(source, &QObject::destroyed, this, [this] {
            beginResetModel();
            endResetModel();
        });
}

void ReversedProxyModel::sort(int, Qt::SortOrder) { QSortFilterProxyModel::sort(0, Qt::AscendingOrder); }

bool ReversedProxyModel::canFetchMore(const QModelIndex &) const { return false; }

void ReversedProxyModel::fetchMore(const QModelIndex &) {}

bool ReversedProxyModel::hasChildren(const QModelIndex &parent) const {
    return !parent.isValid() && rowCount(parent) > 0;
}

bool ReversedProxyModel::lessThan(const QModelIndex &left, const QModelIndex &right) const {
    return left.row() > right.row();
}

bool ReversedProxyModel::filterAcceptsRow(int sourceRow, const QModelIndex &sourceParent) const {
    return !sourceParent.isValid() && QSortFilterProxyModel::filterAcceptsRow(sourceRow, sourceParent);
}

} // namespace im
