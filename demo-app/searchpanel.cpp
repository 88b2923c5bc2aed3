#include "searchpanel.h"

#include <im/client.h>
#include <im/searchmodel.h>

#include <QtCore/QDateTime>
#include <QtGui/QAbstractTextDocumentLayout>
#include <QtGui/QPainter>
#include <QtGui/QTextDocument>
#include <QtWidgets/QCheckBox>
#include <QtWidgets/QHBoxLayout>
#include <QtWidgets/QLabel>
#include <QtWidgets/QLineEdit>
#include <QtWidgets/QListView>
#include <QtWidgets/QPushButton>
#include <QtWidgets/QStyledItemDelegate>
#include <QtWidgets/QVBoxLayout>

using im::SearchModel;

namespace {

// "conv · sender · time" over the snippet, the matched ranges in bold.
QString resultHtml(const QModelIndex &index) {
    const QString snippet = index.data(SearchModel::SnippetRole).toString();
    QString body;
    int at = 0;
    for (const QVariant &v : index.data(SearchModel::SnippetMatchesRole).toList()) {
        const QVariantMap m = v.toMap();
        const int start = m.value(QStringLiteral("start")).toInt(), length = m.value(QStringLiteral("length")).toInt();
        if (start < at)
            continue;
        body += snippet.mid(at, start - at).toHtmlEscaped();
        body += QStringLiteral("<b>") + snippet.mid(start, length).toHtmlEscaped() + QStringLiteral("</b>");
        at = start + length;
    }
    body += snippet.mid(at).toHtmlEscaped();
    const QDateTime ts = index.data(SearchModel::TimestampRole).toDateTime().toLocalTime();
    return QStringLiteral("<span style='color:gray'>%1 · %2 · %3 · #%4</span><br>%5")
        .arg(index.data(SearchModel::ConvRole).toString().toHtmlEscaped(),
             index.data(SearchModel::SenderRole).toString().toHtmlEscaped(),
             ts.toString(QStringLiteral("yyyy-MM-dd HH:mm")),
             QString::number(index.data(SearchModel::SeqRole).toLongLong()), body);
}

class ResultDelegate : public QStyledItemDelegate {
public:
    using QStyledItemDelegate::QStyledItemDelegate;
    void paint(QPainter *painter, const QStyleOptionViewItem &option, const QModelIndex &index) const override {
        QStyleOptionViewItem opt = option;
        initStyleOption(&opt, index);
        opt.text.clear();
        opt.widget->style()->drawControl(QStyle::CE_ItemViewItem, &opt, painter, opt.widget);
        QTextDocument doc;
        doc.setDefaultFont(opt.font);
        doc.setTextWidth(opt.rect.width());
        doc.setHtml(resultHtml(index));
        painter->save();
        painter->translate(opt.rect.topLeft());
        doc.drawContents(painter, QRectF(0, 0, opt.rect.width(), opt.rect.height()));
        painter->restore();
    }
    QSize sizeHint(const QStyleOptionViewItem &option, const QModelIndex &index) const override {
        QTextDocument doc;
        doc.setDefaultFont(option.font);
        doc.setTextWidth(std::max(200, option.rect.width()));
        doc.setHtml(resultHtml(index));
        return QSize(int(doc.idealWidth()), int(doc.size().height()));
    }
};

} // namespace

SearchPanel::SearchPanel(im::Client *client, QWidget *parent)
    : QGroupBox(tr("Search"), parent), model_(new SearchModel(client, this)) {
    setObjectName(QStringLiteral("searchPanel"));
    box_ = new QLineEdit;
    box_->setObjectName(QStringLiteral("searchBox"));
    box_->setPlaceholderText(tr("Search messages (words, prefixes, 中文)"));
    box_->setClearButtonEnabled(true);
    thisConvOnly_ = new QCheckBox(tr("This conversation only"));
    thisConvOnly_->setObjectName(QStringLiteral("searchThisConversation"));
    results_ = new QListView;
    results_->setObjectName(QStringLiteral("searchResults"));
    results_->setModel(model_);
    results_->setItemDelegate(new ResultDelegate(results_));
    results_->setUniformItemSizes(false);
    results_->setWordWrap(true);
    results_->setEditTriggers(QAbstractItemView::NoEditTriggers);
    status_ = new QLabel;
    status_->setObjectName(QStringLiteral("searchStatus"));
    notice_ = new QLabel;
    notice_->setObjectName(QStringLiteral("searchNotice"));
    notice_->setWordWrap(true);
    loadButton_ = new QPushButton(tr("Load missing history"));
    loadButton_->setObjectName(QStringLiteral("searchLoadMissing"));

    auto *top = new QHBoxLayout;
    top->addWidget(box_, 1);
    top->addWidget(thisConvOnly_);
    auto *noticeRow = new QHBoxLayout;
    noticeRow->addWidget(notice_, 1);
    noticeRow->addWidget(loadButton_);
    auto *layout = new QVBoxLayout(this);
    layout->addLayout(top);
    layout->addWidget(results_, 1);
    layout->addWidget(status_);
    layout->addLayout(noticeRow);

    connect(box_, &QLineEdit::textChanged, model_, &SearchModel::setQuery);
    connect(thisConvOnly_, &QCheckBox::toggled, this, &SearchPanel::updateScope);
    connect(results_, &QListView::activated, this, [this](const QModelIndex &index) {
        emit resultActivated(index.data(SearchModel::ConvRole).toString(),
                             index.data(SearchModel::SeqRole).toLongLong());
    });
    connect(loadButton_, &QPushButton::clicked, model_, [this] { model_->loadMissing(); });
    for (auto signal : {&SearchModel::searchingChanged, &SearchModel::countChanged, &SearchModel::indexingChanged})
        connect(model_, signal, this, &SearchPanel::updateNotice);
    connect(model_, &SearchModel::incompleteConversationsChanged, this, &SearchPanel::updateNotice);
    updateNotice();
}

void SearchPanel::setCurrentConversation(const QString &conv) {
    currentConv_ = conv;
    updateScope();
}

void SearchPanel::updateScope() { model_->setConversation(thisConvOnly_->isChecked() ? currentConv_ : QString()); }

QString SearchPanel::snippetHtml(int row) const { return resultHtml(model_->index(row)); }

QString SearchPanel::noticeText() const { return notice_->text(); }

void SearchPanel::updateNotice() {
    if (model_->query().trimmed().isEmpty())
        status_->clear();
    else if (model_->isSearching())
        status_->setText(tr("Searching…"));
    else
        status_->setText(model_->canFetchMore() ? tr("%n result(s) so far", nullptr, model_->count())
                                                : tr("%n result(s)", nullptr, model_->count()));
    QStringList parts;
    if (model_->isIndexing())
        parts << tr("The search index of this store is still being built.");
    const QStringList incomplete = model_->incompleteConversations();
    if (!incomplete.isEmpty())
        parts << tr("Not searched completely: history not loaded here in %1.").arg(incomplete.join(QStringLiteral(", ")));
    notice_->setText(parts.join(u' '));
    notice_->setVisible(!parts.isEmpty());
    loadButton_->setVisible(!incomplete.isEmpty());
}
