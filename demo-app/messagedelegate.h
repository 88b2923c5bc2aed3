// The Message column of the message view, drawn by a delegate: the quote of
// a reply (sender and first line) above its body, "(edited)" beside an
// edited body, "change pending" while an edit or reaction of ours on it is
// in the outbox, and a row of reaction chips (emoji + count, ours
// highlighted) under it. Clicking a chip turns our reaction with that emoji
// on or off (chipClicked; MessageActions sends it).
//
// What it draws comes from the view's model (MessagePanel's RoleTableModel)
// in the roles below, so tests read what the view shows from the model.
#pragma once

#include <QtCore/QVariantList>
#include <QtWidgets/QStyledItemDelegate>

class QAbstractItemView;

class MessageDelegate : public QStyledItemDelegate {
    Q_OBJECT
public:
    /// Roles of the Message column, besides Qt::DisplayRole (the current body).
    enum Role {
        /// QString: "ben: first line" above a reply ("reply to seq N" while
        /// the quoted message is not known); empty for a message that is no reply.
        QuoteRole = Qt::UserRole + 100,
        /// QString: "(edited)" beside an edited body, else empty.
        EditedMarkRole,
        /// QString: "change pending" while an edit / reaction of ours is in the outbox.
        PendingMarkRole,
        /// QVariantList of QVariantMap {emoji, count, mine}: the chips, in order.
        ReactionsRole,
    };

    explicit MessageDelegate(QObject *parent = nullptr);

    void paint(QPainter *painter, const QStyleOptionViewItem &option, const QModelIndex &index) const override;
    QSize sizeHint(const QStyleOptionViewItem &option, const QModelIndex &index) const override;
    bool editorEvent(QEvent *event, QAbstractItemModel *model, const QStyleOptionViewItem &option,
                     const QModelIndex &index) override;
    /// The chip text: "👍 2".
    static QString chipText(const QVariantMap &reaction);
    /// Where `view` draws the chip of `emoji` of `index` (viewport
    /// coordinates; null if none).
    QRect chipRect(const QAbstractItemView *view, const QModelIndex &index, const QString &emoji) const;

Q_SIGNALS:
    /// A click on the chip of `emoji` (mine: our reaction is on) at `index`.
    void chipClicked(const QModelIndex &index, const QString &emoji, bool mine);

private:
    struct Layout {
        QRect quote;
        QRect body;
        QList<QPair<QVariantMap, QRect>> chips;
    };
    Layout layoutFor(const QFont &font, const QRect &cell, const QModelIndex &index) const;
};
