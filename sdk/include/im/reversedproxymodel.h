// im::ReversedProxyModel: a list model upside down, for the usual chat
// layout (newest at the bottom) in a Widgets view.
#pragma once

#include <im/global.h>

#include <QtCore/QSortFilterProxyModel>

namespace im {

/**
 * Shows a flat list model in reverse row order: the source's last row is
 * row 0 here, its row 0 (MessageListModel's newest message) the last row.
 * Put it between a MessageListModel and a QListView / QTableView to show
 * the newest message at the bottom, oldest at the top, as chat clients do.
 * Every change of the source arrives as the matching fine-grained change
 * (a message inserted at the source's row 0 is a row appended here), so
 * the view keeps its scroll position and selection.
 *
 * History is loaded by the app, not by the view: canFetchMore() answers
 * false, because a Qt view calls fetchMore() whenever the model's LAST row
 * is in sight, and here the last row is the newest message, in sight all
 * the time. Call the source's fetchMore() when the user scrolls to the top
 * (the vertical scroll bar's valueChanged at its minimum), and its
 * followNewest() when he is back at the bottom (docs/sdk.md, "Timelines in
 * views"). QML needs no proxy: `ListView { verticalLayoutDirection:
 * ListView.BottomToTop }` lays a MessageListModel out this way and fetches
 * at the top by itself.
 *
 * When the source is destroyed the proxy resets to no rows (modelReset), so
 * views on it never keep rows the model no longer has.
 *
 * Filtering (QSortFilterProxyModel's filter properties) works as usual; the
 * order is always the reverse of the source's (sort() and setSortRole() do
 * not change it). Only flat lists: the source's children are not shown.
 */
class IM_SDK_EXPORT ReversedProxyModel : public QSortFilterProxyModel {
    Q_OBJECT
public:
    explicit ReversedProxyModel(QObject *parent = nullptr);
    ~ReversedProxyModel() override;

    void setSourceModel(QAbstractItemModel *source) override;
    /// Always the reverse of the source's order; `column` and `order` are ignored.
    void sort(int column, Qt::SortOrder order = Qt::AscendingOrder) override;
    /// false: the app loads older rows itself (see above).
    bool canFetchMore(const QModelIndex &parent) const override;
    /// Does nothing (see canFetchMore()).
    void fetchMore(const QModelIndex &parent) override;
    /// No rows below the top level (a flat list).
    bool hasChildren(const QModelIndex &parent = QModelIndex()) const override;

protected:
    bool lessThan(const QModelIndex &left, const QModelIndex &right) const override;
    bool filterAcceptsRow(int sourceRow, const QModelIndex &sourceParent) const override;
};

} // namespace im
