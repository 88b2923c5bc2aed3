// Shows a list model (one column, many roles) as a table: one column per
// role, each with its own formatting. Forwards the source's fine-grained
// insert/remove/move/change notifications so views keep scroll and selection.
#pragma once

#include <QtCore/QAbstractTableModel>
#include <QtCore/QPointer>

#include <functional>

class RoleTableModel : public QAbstractTableModel {
    Q_OBJECT
public:
    /// Returns the value of one cell for a Qt role (DisplayRole, ToolTipRole,
    /// ForegroundRole, BackgroundRole, FontRole, ...), given the source row.
    using Cell = std::function<QVariant(const QModelIndex &source, int role)>;
    struct Column {
        QString title;
        Cell cell;
    };

    RoleTableModel(QAbstractItemModel *source, QList<Column> columns, QObject *parent = nullptr);

    int rowCount(const QModelIndex &parent = QModelIndex()) const override;
    int columnCount(const QModelIndex &parent = QModelIndex()) const override;
    QVariant data(const QModelIndex &index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

    QAbstractItemModel *source() const { return source_; }
    /// The source index (column 0) of a row.
    QModelIndex sourceIndex(int row) const;
    /// Re-evaluate one column for every row (time-dependent text such as "in 2 s").
    void refreshColumn(int column);

private:
    QPointer<QAbstractItemModel> source_;
    QList<Column> columns_;
};
