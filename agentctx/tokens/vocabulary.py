"""The letter runs that o200k encodes as one token with the slash before them ("/src",
"/components", "/Users"): a path segment among these costs one token, any other about one more
than its letters. Read from o200k_base's vocabulary (tests/test_tokens.py checks this list
against it whenever tiktoken is installed)."""

from __future__ import annotations

__all__ = ["SLASH_WORDS"]

SLASH_WORDS = frozenset(
    b"""
A AIDS AP API About Add Admin App Application Auth B Base Button C CD Card Class Common Core
Create D DC DD DVD Data Delete Desktop Dialog Documents E ERC Edit Error Event F FM File
Footer Form Foundation G Game Get Getty Grid H Header Home I IP Icon Image In Input Internal J
K L LICENSE Layout Linux List Login M MAX MM MPL MS Main Menu My N Nav Navbar New O Object
Open P PT Page Post Product Profile Public Q R Re Register S SP ST Search Sh St String Sub
Subthreshold System T TR Table Templates Test Text The Typography U UI UIKit USD User V View W
Web X XML XMLSchema Y YYYY Z a about ac access account accounts action actions activity ad add
address admin ag ajax al all am an android angular antlr ap apache api apimachinery apis app
apple application apps ar archive art article articles artificial as assert assets audio aut
auth avatar aws b back backend background banner bar base bash basic be bg bin bl blob block
blog body book books bootstrap br browser build business button buttons by c cache cal
calendar car card cards cart catalog categories category cgi ch change channel chart chat
check cl class classes client cloud cm co code color colors com comment comments common
community company compiler component components con conf config connect constants contact
container content context contracts control controller controllers cop copyleft core count
course cr create css cu cupertino current custom customer d dashboard dat data database
datatables date day db dd de debug default delete demo des design detail details dev device
dialog direct dis display dist div do doc docker docs document dom domain down download dr
drop e ec eclipse edit editor el em email embed en end entities entity env environment epl
error errors es etc event events ex example examples export ext extensions f fa facebook
favicon features feed file files filter find fire firebase fl flutter font fonts foo footer
form forms forum forums fr frame framework free from front frontend fs full function functions
fw fwlink g gallery game ge gen general generated get gin git github gl global go google gpl
gr graphql grid group groups gtest gui h hash he head header help helper helpers her high
history home hooks hour how hr html http i ic icon icons id im image images img import in inc
include includes index info init input install int inter interface interfaces internal io
ioutil ip is issues item items j java javascript javase job jobs jpeg jquery js json k kernel
key kg km l la lang latest layout le legal lg li lib library libs lic license licenses light
link linux list live load loading local location log logger login logo logout look lounge m
mac mail main man manage manual map maps master material math max md me media member menu
message messages met meta min ml mm mo mobile mock mod modal model models module modules mol
month movie mp ms msg music my mysql n name native nav navbar navigation ne net network new
news ng night no node non not npm ns null o oauth object oct octet oder of off on op open
operator operators options or order orders org os ou out output owl p package packages page
pages par parser pass password path pay payment pdf per person ph photo photos php pi pkg pl
place plain platform play player plugin plugins png poly pop popper post posts pr pre
preferences privacy private pro problem problems process product products profile program
project projects prom property provider providers pub public python q qu query question
questions r random raw re react read red ref reference reg register releases rem remove render
report repos request res reset resource resources respond rest result results right root
router routes rss run runtime s sample save sc schema screens script scripts sdk se search sec
security select self send server service services session set settings settingsdialog setup sh
share shared she shop show sidebar sign signup simple site sites sk sl sn social socket
software song source sp span spec sql src st star start stat state static status std stdc
storage store story stretch stretchr string student style styles sub support svg sw swagger
sys system t tab table tag task tasks team temp template templates tencent test testify
testing tests text th the theme themes thread thumb time title tmp to token tool tools top
topic topics tr train trans tree tutorial twitter type types u ui un unit up update upload
uploads url us use user users usr util utils v value vector vendor vendors ver version video
videos view views vnd vue w watch we weather web week widget widgets wiki window windows work
world wp write ws www x xhtml xml y year yyyy z
""".split()
)
