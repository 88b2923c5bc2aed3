#include "roletablemodel.h"

RoleTableModel::RoleTableModel(QAbstractItemModel *source, QList<Column> columns, QObject *parent)
    : QAbstractTableModel(parent), source_(source), columns_(std::move(columns)) {
    auto top = [](const QModelIndex &p) { return !p.isValid(); };
    connect(source, &QAbstractItemModel::rowsAboutToBeInserted, this,
            [this, top](const QModelIndex &p, int first, int last) {
                if (top(p))
                    beginInsertRows({}, first, last);
            });
    connect(source, &QAbstractItemModel::rowsInserted, this, [this, top](const QModelIndex &p) {
        if (top(p))
            endInsertRows();
    });
    connect(source, &QAbstractItemModel::rowsAboutToBeRemoved, this,
            [this, top](const QModelIndex &p, int first, int last) {
                if (top(p))
                    beginRemoveRows({}, first, last);
            });
    connect(source, &QAbstractItemModel::rowsRemoved, this, [this, top](const QModelIndex &p) {
        if (top(p))
            endRemoveRows();
    });
    connect(source, &QAbstractItemModel::rowsAboutToBeMoved, this,
            [this](const QModelIndex &, int first, int last, const QModelIndex &, int dest) {
                beginMoveRows({}, first, last, {}, dest);
            });
    connect(source, &QAbstractItemModel::rowsMoved, this, [this] { endMoveRows(); });
    connect(source, &QAbstractItemModel::modelAboutToBeReset, this, [this] { beginResetModel(); });
    connect(source, &QAbstractItemModel::modelReset, this, [this] { endResetModel(); });
    // A layout change of the source has no row mapping we could forward: reset.
    connect(source, &QAbstractItemModel::layoutAboutToBeChanged, this, [this] { beginResetModel(); });
    connect(source, &QAbstractItemModel::layoutChanged, this, [this] { endResetModel(); });
    connect(source, &QAbstractItemModel::dataChanged, this,
            [this](const QModelIndex &tl, const QModelIndex &br) {
                if (!tl.isValid() || !br.isValid() || columns_.isEmpty())
                    return;
                emit dataChanged(index(tl.row(), 0), index(br.row(), int(columns_.size()) - 1));
            });
}

int RoleTableModel::rowCount(const QModelIndex &parent) const {
    return parent.isValid() || !source_ ? 0 : source_->rowCount();
}

int RoleTableModel::columnCount(const QModelIndex &parent) const {
    return parent.isValid() ? 0 : int(columns_.size());
}

QModelIndex RoleTableModel::sourceIndex(int row) const {
    return source_ ? source_->index(row, 0) : QModelIndex();
}

QVariant RoleTableModel::data(const QModelIndex &index, int role) const {
    if (!index.isValid() || index.column() >= columns_.size())
        return {};
    const QModelIndex src = sourceIndex(index.row());
    if (!src.isValid())
        return {};
    return columns_.at(index.column()).cell(src, role);
}

QVariant RoleTableModel::headerData(int section, Qt::Orientation orientation, int role) const {
    if (orientation == Qt::Horizontal && role == Qt::DisplayRole && section >= 0 && section < columns_.size())
        return columns_.at(section).title;
    return QAbstractTableModel::headerData(section, orientation, role);
}

void RoleTableModel::refreshColumn(int column) {
    const int rows = rowCount();
    if (rows > 0 && column >= 0 && column < columns_.size())
        emit dataChanged(index(0, column), index(rows - 1, column));
}
