"""Counting a post X's way, and cutting a reply into posts that fit.

X weighs text (twitter-text, version 3): most Latin, Greek, Cyrillic, Hebrew and
Arabic characters and common punctuation weigh 1; everything else, CJK and emoji
included, weighs 2; an emoji sequence (a family, a flag, a skin tone) weighs 2 in
all; a link weighs 23 however long it is. A post may weigh 280::

    >>> weighted_length("hello")
    5
    >>> weighted_length("日本語"), weighted_length("👍"), weighted_length("👨‍👩‍👧")
    (6, 2, 2)
    >>> weighted_length("see https://example.com/" + "a" * 100)
    27
    >>> [weighted_length(p) for p in split_post("word " * 120)]
    [279, 279, 39]

Links are found as twitter-text finds them: a link ends at the first character no URL
holds (CJK or an emoji right after it is weighed on its own), and a host is linked
only when it ends in a top-level domain twitter-text knows (``grafana.corp`` and
``nas.local`` are counted character by character, as X counts them)::

    >>> weighted_length("https://example.com/日本語"), weighted_length("http://nas.local/")
    (29, 17)
"""

from __future__ import annotations

import re
import unicodedata

from autoresponse.interfaces.x.settings import X_POST_WEIGHT, X_URL_WEIGHT

#: Code points that weigh 1 (twitter-text's ranges); every other weighs 2.
_LIGHT = ((0x0000, 0x10FF), (0x2000, 0x200D), (0x2010, 0x201F), (0x2032, 0x2037))

_PICTOGRAPH = ("[\u00a9\u00ae\u203c\u2049\u2122\u2139\u2194-\u2199\u21a9\u21aa\u231a\u231b\u2328"
               "\u23cf\u23e9-\u23f3\u23f8-\u23fa\u24c2\u25aa\u25ab\u25b6\u25c0\u25fb-\u25fe"
               "\u2600-\u27bf\u2934\u2935\u2b05-\u2b07\u2b1b\u2b1c\u2b50\u2b55\u3030\u303d"
               "\u3297\u3299\U0001f000-\U0001faff]")
_MODIFIER = "(?:\ufe0f|[\U0001f3fb-\U0001f3ff]|[\U000e0020-\U000e007f])"
_EMOJI = re.compile(f"[\U0001f1e6-\U0001f1ff]{{2}}"  # a flag: two regional indicators
                    f"|[0-9#*]\ufe0f?\u20e3"  # a keycap
                    f"|{_PICTOGRAPH}{_MODIFIER}*(?:\u200d{_PICTOGRAPH}{_MODIFIER}*)*")  # ZWJ sequences

# Links, as twitter-text 3.1.0 finds them (extractUrlsWithIndices.js and regexp/*.js,
# ported as they are): their character classes, then its one pattern for a URL.
_PUNCT = r"!'#%&()*+,\\\-./:;<=>?@\[\]^_{|}~$"
_SPACES = r"\x09-\x0d\x20\x85\xa0\u1680\u180e\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_INVALID = r"\ufffe\ufeff\uffff"
_DIRECTIONAL = r"\u202a-\u202e\u061c\u200e\u200f\u2066-\u2069"
_LATIN_ACCENTS = (r"\xc0-\xd6\xd8-\xf6\xf8-\xff\u0100-\u024f\u0253\u0254\u0256\u0257\u0259\u025b\u0263"
                  r"\u0268\u026f\u0272\u0289\u028b\u02bb\u0300-\u036f\u1e00-\u1eff")
_CYRILLIC = r"\u0400-\u04ff"
_DOMAIN_CHAR = f"[^{_PUNCT}{_SPACES}{_INVALID}{_DIRECTIONAL}]"
_SUBDOMAIN = f"(?:(?:{_DOMAIN_CHAR}(?:[_-]|{_DOMAIN_CHAR})*)?{_DOMAIN_CHAR}\\.)"
_DOMAIN_NAME = f"(?:(?:{_DOMAIN_CHAR}(?:-|{_DOMAIN_CHAR})*)?{_DOMAIN_CHAR}\\.)"
_PATH_CHAR = f"[a-zA-Z{_CYRILLIC}0-9!*';:=+,.$/%#\\[\\]\\-\u2013_~@|&{_LATIN_ACCENTS}]"
_PARENS = f"\\((?:{_PATH_CHAR}+|(?:{_PATH_CHAR}*\\({_PATH_CHAR}+\\){_PATH_CHAR}*))\\)"
_PATH_END = f"[+\\-a-zA-Z{_CYRILLIC}0-9=_#/{_LATIN_ACCENTS}]"
# twitter-text puts its path's last character ("[...]|balanced parens") into the pattern
# ungrouped, so a path is "chars (parens chars)* end-char" or else parens alone: after
# "!" or "." a bracketed part is no part of the link ("a.com/!(a)" links "a.com/" only).
_PATH = f"(?:(?:{_PATH_CHAR}*(?:{_PARENS}{_PATH_CHAR}*)*{_PATH_END}|{_PARENS})|(?:@{_PATH_CHAR}+/))"
_QUERY_CHAR = r"[a-zA-Z0-9!?*'@();:&=+$/%#\[\]\-_.,~|]"
_QUERY_END = r"[a-zA-Z0-9\-_&=#/]"
#: Words, and the spaces between them (what X takes for spaces).
_WORDS = re.compile(f"(?P<space>[{_SPACES}]+)|[^{_SPACES}]+")
_HOST_RUN = re.compile(f"(?:{_DOMAIN_CHAR}|[_.-])+")
_LONGEST_PROTOCOL = len("https://")
#: The longest run of host characters searched for links as twitter-text searches (from
#: each character on: in a run such as "a-a-a-…" that is quadratic, a minute for one
#: reply). Past it, each top-level domain in the run weighs a link more than its
#: characters: never less than X counts, so a post may be short, never too long.
_MAX_HOST_RUN = 300
#: Filled in below, from the lists at the end of this module.
_URL: re.Pattern[str]
_ASCII_DOMAIN: re.Pattern[str]
_TLD_END: re.Pattern[str]
#: A t.co link holds its slug (and a query) only; one with a longer slug is no link.
_TCO = re.compile(f"(?i:https?://t\\.co/)([a-zA-Z0-9]+)(?:\\?{_QUERY_CHAR}*{_QUERY_END})?")
_MAX_TCO_SLUG = 40
#: twitter-text's longest URL (in UTF-16 code units), and longest label of its host.
_MAX_URL_LENGTH = 4096
_MAX_LABEL_LENGTH = 63
#: What punycode (1.4.1, twitter-text's) takes for the dots between labels.
_LABEL_DOTS = re.compile("[.\u3002\uff0e\uff61]")
_NOT_PRINTABLE_ASCII = re.compile("[^\x20-\x7e]")


def _char_weight(char: str) -> int:
    point = ord(char)
    return 1 if any(low <= point <= high for low, high in _LIGHT) else 2


def _chars_weight(text: str) -> int:
    return sum(_char_weight(c) for c in text)


def _utf16_length(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _label_length(label: str) -> int:
    """The length of ``label`` in its ASCII (punycode) form, as twitter-text measures it."""
    parts = _LABEL_DOTS.split(label)
    encoded = [4 + len(part.encode("punycode")) if _NOT_PRINTABLE_ASCII.search(part) else len(part)
               for part in parts]
    return sum(encoded) + len(parts) - 1


def _valid_url(url: str, protocol: str, domain: str) -> bool:
    """Whether twitter-text keeps a URL it found (``isValidUrl``): a host it can write in
    ASCII, and not too long."""
    if domain.startswith("xn--") and not _ASCII_DOMAIN.search(domain):
        return False  # punycode holds nothing but ASCII
    if not all(1 <= _label_length(label) <= _MAX_LABEL_LENGTH for label in domain.split(".")):
        return False
    return _utf16_length(protocol) + _utf16_length(url) <= _MAX_URL_LENGTH


def _links(text: str) -> tuple[dict[int, int], set[int]]:
    """Where X sees links in ``text``: by the start of each, how many UTF-16 code units
    of it twitter-text passes over as one link (``parseTweet``); and where a run of host
    characters too long to search (``_MAX_HOST_RUN``) has a top-level domain end, each
    counted as a link besides the characters around it."""
    links: dict[int, int] = {}
    unsearched: set[int] = set()
    position = 0  # where twitter-text looks on from (its ``lastIndex``)
    for host_run in _HOST_RUN.finditer(text):
        if host_run.end() - host_run.start() > _MAX_HOST_RUN:
            unsearched.update(end.start() for end in _TLD_END.finditer(text, host_run.start(), host_run.end()))
            position = host_run.end()
            continue
        # A link's host lies in one run of host characters and ends in a known TLD; in
        # front of it, a protocol and the character before. Looking only there, not at
        # every character of a long run of CJK, keeps this from taking seconds.
        last = _last_tld_end(text, host_run.start(), host_run.end())
        start = max(position, host_run.start() - _LONGEST_PROTOCOL - 1)
        while last is not None and start <= last:  # a top-level domain ends the run at or after it
            if (match := _URL.match(text, start)) is None:
                start += 1
                continue
            position = start = match.end()  # what is no link is passed over whole, as in twitter-text
            _take_link(match, links)
    return links, unsearched


def _last_tld_end(text: str, start: int, end: int) -> int | None:
    """Where in ``text[start:end]`` the last ``.tld`` twitter-text knows begins, if any."""
    dot = text.rfind(".", start, end)
    while dot != -1:
        if _TLD_END.match(text, dot, end):
            return dot
        dot = text.rfind(".", start, dot)
    return None


def _take_link(match: re.Match[str], links: dict[int, int]) -> None:
    """Note the link ``match`` (of ``_URL``) is, if twitter-text takes it for one."""
    url, protocol, domain = match.group("url", "protocol", "domain")
    start = match.start("url")
    if not _valid_url(url, protocol or "https://", domain):
        return
    if protocol:
        tco = _TCO.match(url)
        if tco is not None:
            if len(tco.group(1)) > _MAX_TCO_SLUG:
                return
            url = tco.group()
        links[start] = _utf16_length(url)
        return
    # Without a protocol, only the ASCII domains in it are links (the last with the path).
    if match.group("before") in ("-", "_", ".", "/"):
        return
    found, last = 0, ""
    for ascii_domain in _ASCII_DOMAIN.finditer(domain):
        last = ascii_domain.group()
        at = domain.find(last, found)
        found = at + len(last)
        links[start + at] = len(last)
    if last and match.group("path"):
        # As long as that domain and the path: what follows the domain in the host is
        # read again, character by character.
        links[start + found - len(last)] = len(last) + _utf16_length(url) - _utf16_length(domain)


def units(text: str) -> list[tuple[str, int]]:
    """``text`` as the pieces X weighs (a link, an emoji sequence, a character), with weights."""
    links, unsearched = _links(text)
    emoji = {match.start(): match.end() for match in _EMOJI.finditer(text)}
    found: list[tuple[str, int]] = []
    at = 0
    while at < len(text):
        if at in links:  # a link first, then an emoji, then a character: parseTweet's order
            end, left = at, links[at]
            while end < len(text) and left > 0:
                left -= _utf16_length(text[end])
                end += 1
            # Passing over half an emoji, twitter-text reads its other half as a character.
            found.append((text[at:end], X_URL_WEIGHT + (2 if left < 0 else 0)))
            at = end
        elif at in emoji:
            found.append((text[at:emoji[at]], 2))
            at = emoji[at]
        else:  # a dot a top-level domain of an unsearched run begins at weighs a link more
            found.append((text[at], _char_weight(text[at]) + (X_URL_WEIGHT if at in unsearched else 0)))
            at += 1
    return found


def weighted_length(text: str) -> int:
    """The length X counts for ``text`` (after NFC normalization, as X does)."""
    return sum(weight for _, weight in units(unicodedata.normalize("NFC", text)))


def _hard_split(word: str, limit: int) -> list[str]:
    """A word too heavy for one post, cut between the pieces X weighs (never inside an
    emoji sequence or a link)."""
    pieces = units(word)
    posts: list[str] = []
    first = 0
    while first < len(pieces):
        last, weight = first + 1, pieces[first][1]
        while last < len(pieces) and weight + pieces[last][1] <= limit:
            weight += pieces[last][1]
            last += 1
        # Weighed alone, a post's ends may read as a link where the word's did not
        # ("abchttp://a.co" is no link; cut after "abc", its rest is one): weigh it so.
        while last - first > 1 and weighted_length("".join(p for p, _ in pieces[first:last])) > limit:
            last -= 1
        posts.append("".join(p for p, _ in pieces[first:last]))
        first = last
    return posts


def split_post(text: str, limit: int = X_POST_WEIGHT) -> list[str]:
    """Posts of at most ``limit`` weighted characters, in order, cut between words."""
    text = unicodedata.normalize("NFC", text).strip()
    posts: list[str] = []
    current, weight = "", 0
    space = ""
    # Links and emoji sequences never hold what X takes for a space, so words weigh
    # independently (and a link's ends read the same at a space as at a post's ends).
    for word in _WORDS.finditer(text):
        token = word.group()
        if word.lastgroup == "space":
            space = token
            continue
        token_weight = weighted_length(token)
        if current and weight + _chars_weight(space) + token_weight <= limit:
            current += space + token
            weight += _chars_weight(space) + token_weight
            continue
        if current:
            posts.append(current)
        current, weight = "", 0
        if token_weight > limit:
            *whole, token = _hard_split(token, limit)
            posts.extend(whole)
            token_weight = weighted_length(token)
        current, weight = token, token_weight
    if current:
        posts.append(current)
    return posts


#: twitter-text 3.1.0's generic top-level domains (regexp/validGTLD.js), in its order.
_GENERIC_TLDS = """
삼성 닷컴 닷넷 香格里拉 餐厅 食品 飞利浦 電訊盈科 集团 通販 购物 谷歌 诺基亚 联通 网络 网站 网店 网址 组织机构 移动 珠宝 点看 游戏 淡马锡 机构 書籍 时尚 新闻 政府
政务 招聘 手表 手机 我爱你 慈善 微博 广东 工行 家電 娱乐 天主教 大拿 大众汽车 在线 嘉里大酒店 嘉里 商标 商店 商城 公益 公司 八卦 健康 信息 佛山 企业 中文网 中信
世界 ポイント ファッション セール ストア コム グーグル クラウド みんな คอม संगठन नेट कॉम همراه موقع موبايلي كوم كاثوليك عرب
شبكة بيتك بازار العليان ارامكو اتصالات ابوظبي קום сайт рус орг онлайн москва ком католик дети
zuerich zone zippo zip zero zara zappos yun youtube you yokohama yoga yodobashi yandex yamaxun
yahoo yachts xyz xxx xperia xin xihuan xfinity xerox xbox wtf wtc wow world works work woodside
wolterskluwer wme winners wine windows win williamhill wiki wien whoswho weir weibo wedding wed
website weber webcam weatherchannel weather watches watch warman wanggou wang walter walmart
wales vuelos voyage voto voting vote volvo volkswagen vodka vlaanderen vivo viva vistaprint
vista vision visa virgin vip vin villas viking vig video viajes vet versicherung
vermögensberatung vermögensberater verisign ventures vegas vanguard vana vacations ups uol uno
university unicom uconnect ubs ubank tvs tushu tunes tui tube trv trust travelersinsurance
travelers travelchannel travel training trading trade toys toyota town tours total toshiba toray
top tools tokyo today tmall tkmaxx tjx tjmaxx tirol tires tips tiffany tienda tickets tiaa
theatre theater thd teva tennis temasek telefonica telecity tel technology tech team tdk tci
taxi tax tattoo tatar tatamotors target taobao talk taipei tab systems symantec sydney swiss
swiftcover swatch suzuki surgery surf support supply supplies sucks style study studio stream
store storage stockholm stcgroup stc statoil statefarm statebank starhub star staples stada srt
srl spreadbetting spot sport spiegel space soy sony song solutions solar sohu software softbank
social soccer sncf smile smart sling skype sky skin ski site singles sina silk shriram showtime
show shouji shopping shop shoes shiksha shia shell shaw sharp shangrila sfr sexy sex sew seven
ses services sener select seek security secure seat search scot scor scjohnson science schwarz
schule school scholarships schmidt schaeffler scb sca sbs sbi saxo save sas sarl sapo sap sanofi
sandvikcoromant sandvik samsung samsclub salon sale sakura safety safe saarland ryukyu rwe run
ruhr rugby rsvp room rogers rodeo rocks rocher rmit rip rio ril rightathome ricoh richardli rich
rexroth reviews review restaurant rest republican report repair rentals rent ren reliance reit
reisen reise rehab redumbrella redstone red recipes realty realtor realestate read raid radio
racing qvc quest quebec qpon pwc pub prudential pru protection property properties promo
progressive prof productions prod pro prime press praxi pramerica post porn politie poker pohl
pnc plus plumbing playstation play place pizza pioneer pink ping pin pid pictures pictet pics
piaget physio photos photography photo phone philips phd pharmacy pfizer pet pccw pay passagens
party parts partners pars paris panerai panasonic pamperedchef page ovh ott otsuka osaka origins
orientexpress organic org orange oracle open ooo onyourside online onl ong one omega ollo
oldnavy olayangroup olayan okinawa office off observer obi nyc ntt nrw nra nowtv nowruz now
norton northwesternmutual nokia nissay nissan ninja nikon nike nico nhk ngo nfl nexus nextdirect
next news newholland new neustar network netflix netbank net nec nba navy natura nationwide name
nagoya nadex nab mutuelle mutual museum mtr mtpc mtn msd movistar movie mov motorcycles moto
moscow mortgage mormon mopar montblanc monster money monash mom moi moe moda mobily mobile mobi
mma mls mlb mitsubishi mit mint mini mil microsoft miami metlife merckmsd meo menu men memorial
meme melbourne meet media med mckinsey mcdonalds mcd mba mattel maserati marshalls marriott
markets marketing market map mango management man makeup maison maif madrid macys luxury luxe
lupin lundbeck ltda ltd lplfinancial lpl love lotto lotte london lol loft locus locker loans
loan llp llc lixil living live lipsy link linde lincoln limo limited lilly like lighting
lifestyle lifeinsurance life lidl liaison lgbt lexus lego legal lefrak leclerc lease lds lawyer
law latrobe latino lat lasalle lanxess landrover land lancome lancia lancaster lamer lamborghini
ladbrokes lacaixa kyoto kuokgroup kred krd kpn kpmg kosher komatsu koeln kiwi kitchen kindle
kinder kim kia kfh kerryproperties kerrylogistics kerryhotels kddi kaufen juniper juegos jprs
jpmorgan joy jot joburg jobs jnj jmp jll jlc jio jewelry jetzt jeep jcp jcb java jaguar iwc
iveco itv itau istanbul ist ismaili iselect irish ipiranga investments intuit international
intel int insure insurance institute ink ing info infiniti industries inc immobilien immo imdb
imamat ikano iinet ifm ieee icu ice icbc ibm hyundai hyatt hughes htc hsbc how house hotmail
hotels hoteles hot hosting host hospital horse honeywell honda homesense homes homegoods
homedepot holiday holdings hockey hkt hiv hitachi hisamitsu hiphop hgtv hermes here helsinki
help healthcare health hdfcbank hdfc hbo haus hangout hamburg hair guru guitars guide guge gucci
guardian group grocery gripe green gratis graphics grainger gov got gop google goog goodyear
goodhands goo golf goldpoint gold godaddy gmx gmo gmbh gmail globo global gle glass glade giving
gives gifts gift ggee george genting gent gea gdn gbiz gay garden gap games game gallup gallo
gallery gal fyi futbol furniture fund fun fujixerox fujitsu ftr frontier frontdoor frogans frl
fresenius free fox foundation forum forsale forex ford football foodnetwork food foo fly
flsmidth flowers florist flir flights flickr fitness fit fishing fish firmdale firestone fire
financial finance final film fido fidelity fiat ferrero ferrari feedback fedex fast fashion
farmers farm fans fan family faith fairwinds fail fage extraspace express exposed expert
exchange everbank events eus eurovision etisalat esurance estate esq erni ericsson equipment
epson epost enterprises engineering engineer energy emerck email education edu edeka eco eat
earth dvr dvag durban dupont duns dunlop duck dubai dtv drive download dot doosan domains doha
dog dodge doctor docs dnp diy dish discover discount directory direct digital diet diamonds dhl
dev design desi dentist dental democrat delta deloitte dell delivery degree deals dealer deal
dds dclk day datsun dating date data dance dad dabur cyou cymru cuisinella csc cruises cruise
crs crown cricket creditunion creditcard credit cpa courses coupons coupon country corsica coop
cool cookingchannel cooking contractors contact consulting construction condos comsec computer
compare company community commbank comcast com cologne college coffee codes coach clubmed club
cloud clothing clinique clinic click cleaning claims cityeats city citic citi citadel cisco
circle cipriani church chrysler chrome christmas chloe chintai cheap chat chase charity channel
chanel cfd cfa cern ceo center ceb cbs cbre cbn cba catholic catering cat casino cash caseih
case casa cartier cars careers career care cards caravan car capitalone capital capetown canon
cancerresearch camp camera cam calvinklein call cal cafe cab bzh buzz buy business builders
build bugatti budapest brussels brother broker broadway bridgestone bradesco box boutique bot
boston bostik bosch boots booking book boo bond bom bofa boehringer boats bnpparibas bnl bmw bms
blue bloomberg blog blockbuster blanco blackfriday black biz bio bingo bing bike bid bible
bharti bet bestbuy best berlin bentley beer beauty beats bcn bcg bbva bbt bbc bayern bauhaus
basketball baseball bargains barefoot barclays barclaycard barcelona bar bank band
bananarepublic banamex baidu baby azure axa aws avianca autos auto author auspost audio audible
audi auction attorney athleta associates asia asda arte art arpa army archi aramco arab
aquarelle apple app apartments aol anz anquan android analytics amsterdam amica amfam amex
americanfamily americanexpress alstom alsace ally allstate allfinanz alipay alibaba alfaromeo
akdn airtel airforce airbus aigo aig agency agakhan africa afl afamilycompany aetna aero aeg
adult ads adac actor active aco accountants accountant accenture academy abudhabi abogado able
abc abbvie abbott abb abarth aarp aaa onion
""".split()

#: twitter-text 3.1.0's country top-level domains (regexp/validCCTLD.js), in its order.
_COUNTRY_TLDS = """
한국 香港 澳門 新加坡 台灣 台湾 中國 中国 გე ລາວ ไทย ලංකා ഭാരതം ಭಾರತ భారత్ சிங்கப்பூர் இலங்கை இந்தியா ଭାରତ ભારત
ਭਾਰਤ ভাৰত ভারত বাংলা भारोत भारतम् भारत ڀارت پاکستان موريتانيا مليسيا مصر قطر فلسطين عمان عراق
سورية سودان تونس بھارت بارت ایران امارات المغرب السعودية الجزائر البحرين الاردن հայ қаз укр срб
рф мон мкд ею бел бг ευ ελ zw zm za yt ye ws wf vu vn vi vg ve vc va uz uy us um uk ug ua tz tw
tv tt tr tp to tn tm tl tk tj th tg tf td tc sz sy sx sv su st ss sr so sn sm sl sk sj si sh sg
se sd sc sb sa rw ru rs ro re qa py pw pt ps pr pn pm pl pk ph pg pf pe pa om nz nu nr np no nl
ni ng nf ne nc na mz my mx mw mv mu mt ms mr mq mp mo mn mm ml mk mh mg mf me md mc ma ly lv lu
lt ls lr lk li lc lb la kz ky kw kr kp kn km ki kh kg ke jp jo jm je it is ir iq io in im il ie
id hu ht hr hn hm hk gy gw gu gt gs gr gq gp gn gm gl gi gh gg gf ge gd gb ga fr fo fm fk fj fi
eu et es er eh eg ee ec dz do dm dk dj de cz cy cx cw cv cu cr co cn cm cl ck ci ch cg cf cd cc
ca bz by bw bv bt bs br bq bo bn bm bl bj bi bh bg bf be bd bb ba az ax aw au at as ar aq ao an
am al ai ag af ae ad ac
""".split()


_TLD = ("(?:(?i:" + "|".join(map(re.escape, _GENERIC_TLDS + _COUNTRY_TLDS)) + ")(?=[^0-9a-zA-Z@+-]|$)"
        "|(?i:xn--[\\-0-9a-z]+))")
_DOMAIN = f"(?:{_SUBDOMAIN}*{_DOMAIN_NAME}{_TLD})"
_URL = re.compile(
    # twitter-text reads UTF-16: a host may start at the second half of an emoji, whatever
    # comes before it (the first half, nothing here, is what comes before).
    f"(?P<before>[^A-Za-z0-9@\uff20$#\uff03{_INVALID}]|[{_DIRECTIONAL}]|^|(?=[\U00010000-\U0010ffff]))"
    f"(?P<url>(?P<protocol>(?i:https?://))?(?P<domain>{_DOMAIN})(?::[0-9]+)?(?P<path>/{_PATH}*)?"
    f"(?:\\?{_QUERY_CHAR}*{_QUERY_END})?)")
_ASCII_DOMAIN = re.compile(f"(?:[\\-a-zA-Z0-9{_LATIN_ACCENTS}]+\\.)+{_TLD}")
_TLD_END = re.compile(f"\\.{_TLD}")
