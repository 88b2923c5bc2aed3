// im::ConversationListModel: the conversations known to the local database.
#pragma once

#include <im/global.h>

#include <QtCore/QAbstractListModel>

#include <memory>

namespace im {

class Client;
class ConversationListModelPrivate;

/**
 * Conversations with their markers (from `convs`, pages and hints), most
 * recent activity first. Updated live.
 */
class IM_SDK_EXPORT ConversationListModel : public QAbstractListModel {
    Q_OBJECT
    Q_PROPERTY(int count READ count NOTIFY countChanged)
public:
    enum Roles {
        ConvRole = Qt::UserRole + 1, ///< QString conversation id (also Qt::DisplayRole)
        KindRole,          ///< QString "direct" or "group"
        HeadRole,          ///< qint64 highest seq the server says we may know
        UnreadRole,        ///< qint64 unread messages from others
        ReadRole,          ///< qint64 the user's read marker
        DeliveredRole,     ///< qint64 this device's delivered marker
        EpochRole,         ///< qint64 the epoch of the local cursor (0 = none yet)
        HasGapRole,        ///< bool: retention purged events we never saw (trimmed)
        CursorRole,        ///< qint64 last applied seq (the sync cursor)
        LastTimestampRole, ///< QDateTime of the newest local event
    };
    Q_ENUM(Roles)

    explicit ConversationListModel(Client *client, QObject *parent = nullptr);
    ~ConversationListModel() override;

    int count() const;
    int rowCount(const QModelIndex &parent = QModelIndex()) const override;
    QVariant data(const QModelIndex &index, int role = Qt::DisplayRole) const override;
    QHash<int, QByteArray> roleNames() const override;
    Q_INVOKABLE QVariant get(int row, int role) const;
    /// Row of a conversation id, or -1.
    Q_INVOKABLE int indexOf(const QString &conv) const;

public Q_SLOTS:
    void refresh();

Q_SIGNALS:
    void countChanged();

private:
    std::unique_ptr<ConversationListModelPrivate> d;
};

} // namespace im
